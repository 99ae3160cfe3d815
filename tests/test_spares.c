/*
 * test_spares.c — the size-keyed list of unused buffers of offload/spares.h:
 * an empty list finds nothing; a full list refuses a fifth buffer (the
 * caller keeps it); find gives the first spare of exactly the size asked;
 * take hands that buffer (and its note) back and moves the last one, note
 * and all, into its slot; the bytes kept add up.
 */
#include "harness.h"
#include "offload/spares.h" // defines: zt__spares_*

static void test_spares(void **state) {
  zt__spares_t s = {0};
  char b[6];
  assert_int_equal(zt__spares_find(&s, 0), -1);
  assert_int_equal(zt__spares_find(&s, 64), -1);
  assert_int_equal(zt__spares_bytes(&s), 0);

  assert_int_equal(zt__spares_put(&s, &b[0], 64, NULL), 1);
  assert_int_equal(zt__spares_put(&s, &b[1], 128, NULL), 1);
  assert_int_equal(zt__spares_put(&s, &b[2], 64, NULL), 1);
  assert_int_equal(zt__spares_put(&s, &b[3], 256, &b[5]), 1);
  assert_int_equal(ZT_SPARES_MAX, 4);
  assert_int_equal(zt__spares_put(&s, &b[4], 64, NULL), 0); /* full: still the caller's */
  assert_int_equal(s.n, 4);
  assert_int_equal(zt__spares_bytes(&s), 64 + 128 + 64 + 256);

  /* Exactly the size: 65 finds nothing, 64 the first of the two. */
  assert_int_equal(zt__spares_find(&s, 65), -1);
  assert_int_equal(zt__spares_find(&s, 63), -1);
  assert_int_equal(zt__spares_find(&s, 64), 0);

  /* Taking slot 0 moves the last (256, and its note) into it. */
  void *note = &b[4];
  assert_ptr_equal(zt__spares_take(&s, 0, &note), &b[0]);
  assert_null(note);
  assert_int_equal(s.n, 3);
  assert_ptr_equal(s.buf[0], &b[3]);
  assert_int_equal(s.bytes[0], 256);
  assert_ptr_equal(s.note[0], &b[5]);
  assert_int_equal(zt__spares_find(&s, 64), 2);
  assert_ptr_equal(zt__spares_take(&s, 2, NULL), &b[2]); /* the last: nothing moves */
  assert_int_equal(zt__spares_find(&s, 64), -1);
  assert_int_equal(zt__spares_bytes(&s), 256 + 128);

  /* Room again after a take. */
  assert_int_equal(zt__spares_put(&s, &b[5], 64, NULL), 1);
  assert_int_equal(zt__spares_find(&s, 64), 2);
  assert_ptr_equal(zt__spares_take(&s, zt__spares_find(&s, 128), NULL), &b[1]);
  assert_ptr_equal(zt__spares_take(&s, 1, NULL), &b[5]);
  assert_ptr_equal(zt__spares_take(&s, 0, &note), &b[3]);
  assert_ptr_equal(note, &b[5]); /* its note followed it */
  assert_int_equal(s.n, 0);
  assert_int_equal(zt__spares_bytes(&s), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spares),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
