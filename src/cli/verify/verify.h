/* verify.h — the `streambp verify` subcommands. */
#ifndef SBP_VERIFY_H
#define SBP_VERIFY_H

int verify_main(int argc, char **argv); /* dispatches on argv[1] */
int verify_diff(int argc, char **argv);
int verify_fd(int argc, char **argv);
int verify_run(int argc, char **argv); /* no subcommand: the full matrix */
int verify_audit(int argc, char **argv);
int verify_suite(int argc, char **argv);
int verify_digest(int argc, char **argv);

#endif
