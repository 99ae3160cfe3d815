/*
 * fuzz_manifest.c — libFuzzer target: zt__manifest_parse on any bytes. It
 * must return 0 or an error code with a sentence, never crash, leak or read
 * past the input; a parsed manifest's checksum check must not either; a
 * parsed manifest must survive to_json and parse again unchanged (the
 * round trip the checkpoint writer relies on), and the text to_json writes
 * must pass its own checksum.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt/manifest.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  zt__err_t e = {{0}};
  zt__manifest_t m;
  int rc = zt__manifest_parse(&m, (const char *)data, size, "fuzz", &e);
  if (rc < 0) {
    /* A failure names what went wrong and leaves *m zeroed. */
    zt__manifest_t zero;
    memset(&zero, 0, sizeof zero);
    if (e.msg[0] == '\0' || memcmp(&m, &zero, sizeof m) != 0) __builtin_trap();
    return 0;
  }
  /* Any outcome, as long as it is one: 0 or ZT_ECKPT with a sentence. */
  int sum = zt__manifest_check_sum((const char *)data, size, &m, "fuzz", &e);
  if (sum != 0 && (sum != ZT_ECKPT || e.msg[0] == '\0')) __builtin_trap();
  char *json;
  if (zt__manifest_to_json(&m, &json) == 0) {
    zt__manifest_t again;
    if (zt__manifest_parse(&again, json, strlen(json), "fuzz (again)", &e) != 0)
      __builtin_trap();
    if (zt__manifest_check_sum(json, strlen(json), &again, "fuzz (again)", &e) != 0)
      __builtin_trap();
    char *json2;
    if (zt__manifest_to_json(&again, &json2) == 0) {
      if (strcmp(json, json2) != 0) __builtin_trap();
      free(json2);
    }
    zt__manifest_free(&again);
    free(json);
  }
  zt__manifest_free(&m);
  return 0;
}
