/* cmd_verify_digest.c — `streambp verify digest FILE`: the fingerprint of a gradient file. */
#include "verify/digest.h"
#include "verify/text.h"
#include "cli.h"
#include "cmd_verify.h"

#include <string.h>

static const char usage[] =
    "usage: streambp verify digest FILE\n"
    "\n"
    "Prints the fingerprint of a gradient file: the loss of its __metadata__ as exact hex, then\n"
    "one line per tensor: name, dtype and the SHA-256 of its stored bytes. Runs with --numerics\n"
    "portable give the same fingerprint on every machine (data/golden/ holds the committed\n"
    "ones).\n";

int verify_digest(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        /* name what is wrong first: the usage alone left an unknown option unexplained */
        if (argc < 2)
            fprintf(stderr, "streambp verify digest: no FILE given\n");
        else if (argc > 2)
            fprintf(stderr, "streambp verify digest: one FILE only (%d arguments given)\n",
                    argc - 1);
        else
            fprintf(stderr, "streambp verify digest: unknown option \"%s\"\n", argv[1]);
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    sbp_file_digest d;
    sbp_err err = {0};
    if (sbp_digest_file(&d, argv[1], &err)) return report_error("verify digest", &err);
    /* sbp_digest_print's format, with each name escaped (sbp_text_escape): a file's tensor name
     * must not be able to print lines of its own into the fingerprint */
    printf("loss %s\n", d.loss[0] ? d.loss : "-");
    char name[SBP_TEXT_ESCAPED];
    for (int i = 0; i < d.n; i++)
        printf("%s %s %s\n", sbp_text_escape(name, sizeof name, d.t[i].name), d.t[i].dtype,
               d.t[i].sha256);
    sbp_file_digest_free(&d);
    return 0;
}
