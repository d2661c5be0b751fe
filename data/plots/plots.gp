# plots.gp — the charts of docs/performance.md, drawn by `make plots` from the CSV files in `dir`:
#   plan-bench.csv, plan-qwen3-8b.csv  (streambp plan --csv: planned peak by schedule and T;
#                                       column 11 is the total)
#   bench.csv                          (streambp bench --csv: measured time and peaks)
# Output: memory-bench.png, memory-qwen3-8b.png, time-bench.png in `out`.
set datafile separator ','
set terminal pngcairo size 900,560 font 'sans,11'
set key top left
set grid
set logscale x 2
set xlabel 'sequence length T (tokens)'
# Rows of the schedules interleave in the CSV files, and an undefined point breaks a line, so
# each curve reads only its own rows.
plan(file, s) = sprintf("< grep '^%s,' %s/%s", s, dir, file)
run(s) = sprintf("< grep '^[0-9]*,%s,' %s/bench.csv", s, dir)
gib(x) = x / 1073741824.0

set output out.'/memory-bench.png'
set title 'Bench model (hidden 512, 4 layers, V 32000), fp32: peak memory of a step'
set ylabel 'peak memory (GiB)'
set logscale y 2
plot plan('plan-bench.csv', 'full') using 2:(gib($11)) with lines lw 2 lc 1 title 'full (planned)', \
     plan('plan-bench.csv', 'ckpt') using 2:(gib($11)) with lines lw 2 lc 2 title 'ckpt, B·T·V logits (planned)', \
     plan('plan-bench.csv', 'ckpt-chunked') using 2:(gib($11)) with lines lw 2 lc 3 title 'ckpt, chunked logits (planned)', \
     plan('plan-bench.csv', 'stream') using 2:(gib($11)) with lines lw 2 lc 4 title 'stream (planned)', \
     run('full') using 1:(gib($9)) with points pt 7 lc 1 title 'full (measured)', \
     run('ckpt') using 1:(gib($9)) with points pt 7 lc 2 title 'ckpt (measured)', \
     run('stream') using 1:(gib($9)) with points pt 7 lc 4 title 'stream (measured)', \
     0.75 with lines dt 2 lc rgb 'black' title '768 MiB (bench --largest 768M)', \
     4 with lines dt 3 lc rgb 'gray40' title '4 GiB'

set output out.'/memory-qwen3-8b.png'
set title "Qwen3-8B, bf16 storage, full gradients, no optimizer: planned peak (the paper's setting)"
plot plan('plan-qwen3-8b.csv', 'full') using 2:(gib($11)) with lines lw 2 lc 1 title 'full', \
     plan('plan-qwen3-8b.csv', 'ckpt') using 2:(gib($11)) with lines lw 2 lc 2 title 'ckpt, T·V logits', \
     plan('plan-qwen3-8b.csv', 'ckpt-chunked') using 2:(gib($11)) with lines lw 2 lc 3 title 'ckpt, chunked logits', \
     plan('plan-qwen3-8b.csv', 'stream') using 2:(gib($11)) with lines lw 2 lc 4 title 'stream', \
     80 with lines dt 2 lc rgb 'black' title '80 GiB'

set output out.'/time-bench.png'
set title 'Bench model, fp32: time of one forward + backward step (median)'
set ylabel 'seconds'
plot run('full') using 1:4 with linespoints lw 2 pt 7 lc 1 title 'full', \
     run('ckpt') using 1:4 with linespoints lw 2 pt 7 lc 2 title 'ckpt', \
     run('stream') using 1:4 with linespoints lw 2 pt 7 lc 4 title 'stream'
