/* json.h — what the project's JSON readers and writers need beyond cJSON. Internal.
 *
 * cJSON accepts some texts that the JSON readers of the other side reject, or read differently:
 *   - bytes that are not UTF-8 (HF's safetensors reader, serde_json, rejects the file);
 *   - duplicate keys: cJSON finds the first, Python's json the last, serde_json rejects them, so
 *     the same file would mean different things to different readers;
 *   - the escape \u0000, which cJSON decodes into a C string that ends there, so two different
 *     names ("a\u0000b", "a") would become the same one.
 * And cJSON prints numbers with 15 significant digits when those parse back to a double within
 * a relative 2^-52 of the value, which is not always the same double, so a written file does not
 * always read back bit for bit. */
#ifndef SBP_JSON_H
#define SBP_JSON_H

#include "../streambp.h"

#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Parses n bytes of text (need not be NUL-terminated) as one JSON value into *out after checking
 * that it is valid UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF)
 * with no raw control character or \u0000 escape in a string, and that no object in it has a
 * key twice. `what` names the text in messages (a path). *out is NULL on failure. */
sbp_status sbp_json_parse(cJSON **out, const char *text, size_t n, const char *what, sbp_err *err);

/* A number node whose text is the shortest of %.15g, %.16g, %.17g that reads back as exactly v
 * (v finite). NULL when out of memory. */
cJSON *sbp_json_number(double v);

/* Whether x is a JSON number holding an integer in [lo, hi]; then *out is that integer. The
 * range is checked on the double before any conversion (a conversion of a double outside the
 * target type's range is undefined behaviour). Beyond +-2^53 not every integer is a double,
 * so a bound there is only as exact as its double. */
int sbp_json_int(const cJSON *x, int64_t lo, int64_t hi, int64_t *out);

#endif
