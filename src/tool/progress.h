/*
 * src/tool/progress.h — the progress line of long commands, on stderr so
 * that stdout holds only the report (--json stays pure JSON).
 *
 * On a terminal the line is rewritten in place at every call. Elsewhere (a
 * pipe, a log file) the latest state is printed as one line when progress
 * starts and then every ZT_PROGRESS_SECONDS seconds (default 10; 0 turns
 * these lines off) by a thread of its own, so a long phase with no new
 * state still shows the command is alive.
 */
#ifndef ZT_TOOL_PROGRESS_H
#define ZT_TOOL_PROGRESS_H

#include <stdio.h>

/* Sets the name the lines start with ("ztier bench nvme"); progress calls
 * before it say "ztier". */
void tool_progress_start(const char *prog);
/* The state now, printf-style. */
void tool_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Clears the line on a terminal, stops the thread elsewhere. Safe to call
 * more than once, and without progress. */
void tool_progress_end(void);

/* A stream whose lines become tool_progress states, for code that reports
 * progress to a FILE * (the checkpoint consolidation). NULL on failure;
 * fclose it, then tool_progress_end. */
FILE *tool_progress_stream(void);

#endif /* ZT_TOOL_PROGRESS_H */
