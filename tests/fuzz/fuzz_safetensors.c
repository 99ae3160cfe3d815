/*
 * fuzz_safetensors.c — libFuzzer target: zt__st_parse_header on any bytes,
 * taken as a whole file. It must return 0 or an error code with a sentence,
 * never crash, leak or read past the input; a header it accepts must
 * describe tensors that lie inside the input and tile its data.
 */
#include <string.h>

#include "ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  zt__err_t e = {{0}};
  zt__st_header_t h;
  int rc = zt__st_parse_header(&h, data, size, size, "fuzz", &e);
  if (rc < 0) {
    if (e.msg[0] == '\0' || h.tensors != NULL || h.meta != NULL) __builtin_trap();
    return 0;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < h.n_tensors; i++) {
    const zt__st_tensor_t *t = &h.tensors[i];
    if (t->begin != at || t->end < t->begin) __builtin_trap();
    at = t->end;
  }
  if (h.data_start + at != size) __builtin_trap();
  zt__st_header_free(&h);
  return 0;
}
