/* lora.h — the adapter reader's parts that are tested on their own (tests/fuzz). Internal. */
#ifndef SBP_IO_LORA_H
#define SBP_IO_LORA_H

#include "../streambp.h"

#include <cJSON.h>

/* An adapter_config.json object, parsed and checked: every field typed exactly (booleans are
 * JSON true/false), r and lora_alpha range-checked, peft features that change the math and are
 * not implemented refused by name. path only names the file in messages. */
sbp_status sbp_lora_config_from_json(sbp_lora_config *c, const cJSON *j, const char *path,
                                     sbp_err *err);

#endif
