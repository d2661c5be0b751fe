/* settings.c — a run's settings: what a resumed run must share with the run it continues,
 * as (key, text) pairs in trainer_state.json (see run.h). */
#include "run.h"
#include "../core/objective.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void set_str(sbp_train_settings *s, const char *key, const char *v) {
    s->key[s->n] = key;
    snprintf(s->val[s->n++], sizeof s->val[0], "%s", v);
}
static void set_num(sbp_train_settings *s, const char *key, double v) {
    char t[40];
    snprintf(t, sizeof t, "%.17g", v);
    set_str(s, key, t);
}
static void set_hash(sbp_train_settings *s, const char *key, uint64_t h) {
    char t[20];
    snprintf(t, sizeof t, "%016" PRIx64, h);
    set_str(s, key, t);
}

/* The names `--objective` and `--loss-type` take (src/cli/objopts.c parses them). */
static const char *objective_name(sbp_objective_kind k) {
    return sbp_obj_kind_name(k);
}
static const char *loss_name(const sbp_objective *o) {
    return sbp_obj_loss_name(o);
}

void sbp_describe_model(char *buf, size_t n, const sbp_config *c) {
    snprintf(buf, n, "%s L=%d C=%d F=%d heads %d/%d head_dim %d V=%d%s%s%s", c->model_type,
             c->layers, c->hidden, c->ffn, c->heads, c->kv_heads, c->head_dim, c->vocab,
             c->tied ? " tied" : "", c->qkv_bias ? " qkv-bias" : "", c->qk_norm ? " qk-norm" : "");
}

void sbp_describe_lora(char *buf, size_t n, const sbp_lora_config *c) {
    static const char *const names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
    int k = snprintf(buf, n, "r %d, alpha %.17g, use_rslora %d, targets", c->r, c->alpha,
                     c->use_rslora);
    for (int i = 0; i < 7 && k > 0 && (size_t)k < n; i++)
        if (c->targets & (1u << i)) k += snprintf(buf + k, n - (size_t)k, " %s", names[i]);
}

void sbp_train_settings_build(sbp_train_settings *s, const sbp_train_opts *o, const sbp_model *m,
                              uint64_t w_hash, const sbp_lora *lora, uint64_t lora_hash,
                              const sbp_data *d, uint64_t ref_hash) {
    char desc[160];
    const sbp_objective *ob = &o->g.objective;
    s->n = 0;
    sbp_describe_model(desc, sizeof desc, &m->cfg);
    set_str(s, "model", desc);
    set_str(s, "precision", o->prec == SBP_FP64 ? "fp64" : "fp32");
    set_hash(s, "initial_weights", w_hash);
    if (lora) {
        sbp_describe_lora(desc, sizeof desc, &lora->cfg);
        set_str(s, "lora", desc);
        set_hash(s, "initial_adapter", lora_hash);
    }
    set_str(s, "objective", objective_name(ob->kind));
    set_str(s, "loss_type", loss_name(ob));
    set_num(s, "beta", ob->beta);
    set_num(s, "label_smoothing", ob->label_smoothing);
    set_num(s, "epsilon_low", ob->epsilon_low);
    set_num(s, "epsilon_high", ob->epsilon_high);
    set_num(s, "temperature", ob->temperature);
    set_num(s, "max_completion_length", ob->max_completion_length);
    set_num(s, "scale_rewards", o->scale_rewards);
    if (o->ref_model)
        set_hash(s, "reference_model", ref_hash);
    else
        set_str(s, "reference_model", "none");
    set_str(s, "data", o->jsonl ? "jsonl" : "batch files");
    set_hash(s, "data_contents", sbp_data_hash(d));
    set_num(s, "data_items", (double)sbp_data_items(d));
    set_num(s, "seq", o->T);
    set_num(s, "batch_size", o->jsonl ? o->B : 1);
    set_num(s, "shuffle", o->shuffle);
    set_num(s, "seed", (double)o->seed);
    set_num(s, "steps", o->steps);
    set_num(s, "grad_accum", o->grad_accum);
    set_num(s, "lr", o->sched.lr);
    set_str(s, "lr_scheduler", sbp_lr_kind_name(o->sched.kind));
    set_num(s, "warmup_steps", o->warmup);
    set_num(s, "beta1", o->adam.beta1);
    set_num(s, "beta2", o->adam.beta2);
    set_num(s, "eps", o->adam.eps);
    set_num(s, "weight_decay", o->adam.weight_decay);
    set_num(s, "no_decay_norms_biases", o->no_decay_nb);
    set_num(s, "max_grad_norm", o->max_grad_norm);
    set_num(s, "block", o->g.block ? o->g.block : SBP_DEFAULT_BLOCK);
}

const char *sbp_train_setting_label(const char *key) {
    static const char *const labels[][2] = {
        {"model", "the model (config.json)"},
        {"precision", "--precision"},
        {"initial_weights", "initial weights (hash of --model's weights)"},
        {"lora", "the LoRA adapter (--lora: its adapter_config.json)"},
        {"initial_adapter", "initial adapter (hash of --lora's tensors)"},
        {"objective", "--objective"},
        {"loss_type", "--loss-type"},
        {"beta", "--beta"},
        {"label_smoothing", "--label-smoothing"},
        {"epsilon_low", "--epsilon-low"},
        {"epsilon_high", "--epsilon-high"},
        {"temperature", "--temperature"},
        {"max_completion_length", "--max-completion-length"},
        {"scale_rewards", "reward scaling (--no-scale-rewards)"},
        {"reference_model", "reference model (hash of --ref-model's weights)"},
        {"data", "the kind of data (--data or --jsonl)"},
        {"data_contents", "data contents (hash of the files, in order)"},
        {"data_items", "data items (batch files or records)"},
        {"seq", "--seq"},
        {"batch_size", "--batch-size"},
        {"shuffle", "--shuffle"},
        {"seed", "--seed"},
        {"steps", "--steps"},
        {"grad_accum", "--grad-accum"},
        {"lr", "--lr"},
        {"lr_scheduler", "--lr-scheduler"},
        {"warmup_steps", "--warmup-steps"},
        {"beta1", "--beta1"},
        {"beta2", "--beta2"},
        {"eps", "--eps"},
        {"weight_decay", "--weight-decay"},
        {"no_decay_norms_biases", "--no-decay-norms-biases"},
        {"max_grad_norm", "--max-grad-norm"},
        {"block", "--block"}};
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++)
        if (strcmp(labels[i][0], key) == 0) return labels[i][1];
    return key;
}

uint64_t sbp_train_settings_hash(const sbp_train_settings *s) {
    uint64_t h = 0;
    for (int i = 0; i < s->n; i++) {
        h = sbp_hash64(s->key[i], strlen(s->key[i]) + 1, h);
        h = sbp_hash64(s->val[i], strlen(s->val[i]) + 1, h);
    }
    return h;
}
