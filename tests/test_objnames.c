/* test_objnames.c — the one table of objective and loss-type names (src/core/objective.c):
 * every name parses back to the value it names, and the names are the ones the command line,
 * the run's settings and the audit reports have always printed. */
#include "testutil.h"
#include "../src/core/objective.h"

#include <string.h>

START_TEST(kind_roundtrip) {
    static const char *names[] = {"sft", "dpo", "grpo"};
    static const sbp_objective_kind kinds[] = {SBP_OBJ_SFT, SBP_OBJ_DPO, SBP_OBJ_GRPO};
    for (int i = 0; i < 3; i++) {
        sbp_objective_kind k = SBP_OBJ_SFT;
        ck_assert_int_eq(sbp_obj_kind_parse(&k, names[i]), 1);
        ck_assert_int_eq(k, kinds[i]);
        ck_assert_str_eq(sbp_obj_kind_name(kinds[i]), names[i]);
    }
    sbp_objective_kind k = SBP_OBJ_DPO;
    ck_assert_int_eq(sbp_obj_kind_parse(&k, "ppo"), 0);
    ck_assert_int_eq(k, SBP_OBJ_DPO); /* untouched on failure */
}
END_TEST

START_TEST(loss_roundtrip) {
    static const char *dpo[] = {"sigmoid", "ipo"}, *grpo[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
    sbp_objective o = {.kind = SBP_OBJ_DPO};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(sbp_obj_loss_parse(&o, dpo[i]), 1);
        ck_assert_int_eq(o.dpo_loss, i);
        ck_assert_str_eq(sbp_obj_loss_name(&o), dpo[i]);
    }
    ck_assert_int_eq(sbp_obj_loss_parse(&o, "bnpo"), 0); /* a GRPO loss is no DPO loss */
    o.kind = SBP_OBJ_GRPO;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(sbp_obj_loss_parse(&o, grpo[i]), 1);
        ck_assert_int_eq(o.grpo_loss, i);
        ck_assert_str_eq(sbp_obj_loss_name(&o), grpo[i]);
    }
    ck_assert_int_eq(sbp_obj_loss_parse(&o, "ipo"), 0);
    o.kind = SBP_OBJ_SFT;
    ck_assert_int_eq(sbp_obj_loss_parse(&o, "sigmoid"), 0);
    ck_assert_str_eq(sbp_obj_loss_name(&o), "-");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("objnames");
    TCase *tc = tcase_create("objnames");
    tcase_add_test(tc, kind_roundtrip);
    tcase_add_test(tc, loss_roundtrip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
