/* text.h — file-derived strings made safe to print in a text report. */
#ifndef SBP_VERIFY_TEXT_H
#define SBP_VERIFY_TEXT_H

#include <stddef.h>

/* Copies s into out (n bytes, n >= 16) so that it prints as one inert run of characters: C0
 * controls and DEL become \n, \r, \t or \xHH, a backslash \\, C1 controls and the Unicode line
 * separators and bidirectional overrides \uHHHH, and each byte of invalid UTF-8 \xHH; printable
 * ASCII and other valid UTF-8 pass unchanged. A name read from a file can then neither start a
 * line of its own (a forged "PASS") nor send a terminal escape that hides one. Too long a result
 * ends in "...". Returns out. NULL prints as "(null)". */
const char *sbp_text_escape(char *out, size_t n, const char *s);

/* An out buffer large enough for the escaped form (at most 4 bytes per byte) of every string the
 * reports print: names, metadata values, a diagnosis line, the list of extra names. */
#define SBP_TEXT_ESCAPED 4096

#endif
