/* golden.c — the long golden cases' manifest (see golden.h). */
#include "golden.h"
#include "../src/core/err.h"

#include <stdio.h>
#include <string.h>

static int word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* Copies field [s, e) trimmed into out (n bytes); 0 when it does not fit or holds a character
 * other than word characters (and single spaces between words, when spaces). */
static int field(char *out, size_t n, const char *s, const char *e, int spaces) {
    while (s < e && *s == ' ') s++;
    while (e > s && e[-1] == ' ') e--;
    if (s == e || (size_t)(e - s) >= n) return 0;
    for (const char *p = s; p < e; p++)
        if (!word_char(*p) && !(spaces && *p == ' ' && p[1] != ' ')) return 0;
    memcpy(out, s, (size_t)(e - s));
    out[e - s] = '\0';
    return 1;
}

sbp_status sbp_golden_cases_parse(sbp_golden_case *out, int max, int *n, const char *text,
                                  const char *what, sbp_err *err) {
    *n = 0;
    for (int line = 1; *text; line++) {
        const char *end = text + strcspn(text, "\n"), *s = text;
        text = *end ? end + 1 : end;
        while (s < end && *s == ' ') s++;
        if (s == end || *s == '#') continue;
        const char *bar[6];
        int k = 0;
        for (const char *p = s; p < end && k < 6; p++)
            if (*p == '|') bar[k++] = p;
        if (k != 5)
            return sbp_fail(err, SBP_EINPUT, "%s:%d: want six fields separated by '|'", what, line);
        if (*n == max) return sbp_fail(err, SBP_EINPUT, "%s: more than %d cases", what, max);
        sbp_golden_case *c = &out[*n];
        char where[16];
        memset(c, 0, sizeof *c);
        const int ok = field(c->name, sizeof c->name, s, bar[0], 0) &&
                       field(c->config, sizeof c->config, bar[0] + 1, bar[1], 0) &&
                       field(c->batch, sizeof c->batch, bar[1] + 1, bar[2], 0) &&
                       field(where, sizeof where, bar[2] + 1, bar[3], 0) &&
                       field(c->adapter, sizeof c->adapter, bar[3] + 1, bar[4], 1) &&
                       field(c->options, sizeof c->options, bar[4] + 1, end, 1);
        if (!ok || (strcmp(where, "any") != 0 && strcmp(where, "cpu") != 0))
            return sbp_fail(err, SBP_EINPUT,
                            "%s:%d: a field is empty, too long, or holds a character other than "
                            "[A-Za-z0-9._-] (and spaces in the options); where is any or cpu",
                            what, line);
        c->cpu_only = strcmp(where, "cpu") == 0;
        if (strcmp(c->adapter, "-") == 0) c->adapter[0] = '\0';
        for (int i = 0; i < *n; i++)
            if (strcmp(out[i].name, c->name) == 0)
                return sbp_fail(err, SBP_EINPUT, "%s:%d: case %s named twice", what, line, c->name);
        (*n)++;
    }
    return SBP_OK;
}
