# plots.gp — the README's charts, drawn by `make plots` from the CSV files in `dir`:
#   plan-bench.csv, plan-qwen3-8b.csv  (streambp plan --csv: planned peak by schedule and T)
#   bench.csv                          (streambp bench --csv: measured time and peaks)
# Output: memory-bench.png, memory-qwen3-8b.png, time-bench.png in `out`.
set datafile separator ','
set terminal pngcairo size 900,560 font 'sans,11'
set key top left
set grid
set logscale x 2
set xlabel 'sequence length T (tokens)'
sched(name, col) = (strcol(1) eq name ? column(col) : 1/0)
gib(x) = x / 1073741824.0

set output out.'/memory-bench.png'
set title 'Bench model (hidden 512, 4 layers, V 32000), fp32: peak memory of a step'
set ylabel 'peak memory (GiB)'
set logscale y 2
plot dir.'/plan-bench.csv' using 2:(gib(sched("full", 10))) with lines lw 2 title 'full (planned)', \
     '' using 2:(gib(sched("ckpt", 10))) with lines lw 2 title 'ckpt, B·T·V logits (planned)', \
     '' using 2:(gib(sched("ckpt-chunked", 10))) with lines lw 2 title 'ckpt, chunked logits (planned)', \
     '' using 2:(gib(sched("stream", 10))) with lines lw 2 title 'stream (planned)', \
     dir.'/bench.csv' using 1:(strcol(2) eq "full" ? gib(column(9)) : 1/0) with points pt 7 lc 1 title 'full (measured)', \
     '' using 1:(strcol(2) eq "ckpt" ? gib(column(9)) : 1/0) with points pt 7 lc 2 title 'ckpt (measured)', \
     '' using 1:(strcol(2) eq "stream" ? gib(column(9)) : 1/0) with points pt 7 lc 4 title 'stream (measured)', \
     4 with lines dt 2 lc rgb 'black' title '4 GiB budget'

set output out.'/memory-qwen3-8b.png'
set title "Qwen3-8B, bf16 storage, full gradients, no optimizer: planned peak (the paper's setting)"
plot dir.'/plan-qwen3-8b.csv' using 2:(gib(sched("full", 10))) with lines lw 2 title 'full', \
     '' using 2:(gib(sched("ckpt", 10))) with lines lw 2 title 'ckpt, T·V logits', \
     '' using 2:(gib(sched("ckpt-chunked", 10))) with lines lw 2 title 'ckpt, chunked logits', \
     '' using 2:(gib(sched("stream", 10))) with lines lw 2 title 'stream', \
     80 with lines dt 2 lc rgb 'black' title '80 GiB'

set output out.'/time-bench.png'
set title 'Bench model, fp32: time of one forward + backward step (median)'
set ylabel 'seconds'
plot dir.'/bench.csv' using 1:(strcol(2) eq "full" ? column(4) : 1/0) with linespoints lw 2 pt 7 title 'full', \
     '' using 1:(strcol(2) eq "ckpt" ? column(4) : 1/0) with linespoints lw 2 pt 7 title 'ckpt', \
     '' using 1:(strcol(2) eq "stream" ? column(4) : 1/0) with linespoints lw 2 pt 7 title 'stream'
