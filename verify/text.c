/* text.c — escaping of file-derived strings for text reports (see text.h). */
#include "text.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (2-4) and its code point, or 0 when the bytes at
 * s are not one (overlong forms, surrogates and values above U+10FFFF included). */
static int utf8_seq(const unsigned char *s, uint32_t *cp) {
    int len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : 2;
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (s[0] < 0xc2 || s[0] > 0xf4) return 0;
    uint32_t c = s[0] & (0x3f >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the terminating NUL */
        c = c << 6 | (s[i] & 0x3f);
    }
    if (c < min[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
    *cp = c;
    return len;
}

/* Code points that move or hide text on a terminal although they are valid: C1 controls (some
 * terminals act on U+009B as CSI), line and paragraph separators, bidirectional overrides and
 * isolates (text that reads differently from how it is stored). */
static int unsafe_cp(uint32_t c) {
    return (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 || (c >= 0x202a && c <= 0x202e) ||
           (c >= 0x2066 && c <= 0x2069) || c == 0x200e || c == 0x200f || c == 0x061c;
}

const char *sbp_text_escape(char *out, size_t n, const char *s) {
    if (!s) s = "(null)";
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    while (*p) {
        char piece[16];
        size_t len;
        uint32_t cp;
        int k;
        if (*p == '\\') {
            len = (size_t)snprintf(piece, sizeof piece, "\\\\"), k = 1;
        } else if (*p >= 0x20 && *p < 0x7f) {
            piece[0] = (char)*p, len = 1, k = 1;
        } else if (*p == '\n' || *p == '\r' || *p == '\t') {
            len = (size_t)snprintf(piece, sizeof piece, "\\%c",
                                   *p == '\n'   ? 'n'
                                   : *p == '\r' ? 'r'
                                                : 't');
            k = 1;
        } else if (*p >= 0x80 && (k = utf8_seq(p, &cp)) > 0) {
            if (unsafe_cp(cp))
                len = (size_t)snprintf(piece, sizeof piece, "\\u%04X", (unsigned)cp);
            else
                memcpy(piece, p, (size_t)k), len = (size_t)k;
        } else {
            len = (size_t)snprintf(piece, sizeof piece, "\\x%02X", *p), k = 1;
        }
        if (o + len + 4 > n) { /* room for "..." and the NUL, or cut here */
            snprintf(out + o, n - o, "...");
            return out;
        }
        memcpy(out + o, piece, len);
        o += len;
        p += k;
    }
    out[o] = '\0';
    return out;
}
