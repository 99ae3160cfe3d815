/*
 * support.c — what the fuzz targets link in place of the engine. They build
 * the parsers from source with only the files those need (see the Makefile's
 * FUZZ_SRC); errors.c's zt_last_error() asks whether an engine is live,
 * and linking engine.c for that would pull in the whole runtime. The parsers
 * never have an engine, so no engine is ever live here.
 */
#include "engine.h" // defines: zt__engine_valid

int zt__engine_valid(const zt_engine_t *eng) {
  (void)eng;
  return 0;
}
