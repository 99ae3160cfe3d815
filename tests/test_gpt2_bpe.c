/*
 * test_gpt2_bpe.c — examples/gpt2's GPT-2 tokenizer (bpe.c) on small
 * vocab.json and merges.txt files written here: the 256 byte tokens with
 * GPT-2's ids, plus a few merges.
 *
 * The expected pre-token cuts were produced by GPT-2's pattern in the Python
 * regex module (2026.5.9), and the expected ids by encoder.py's own code on
 * the files this test writes (the mini vocabulary's merges and its ids are
 * made up, but the 256 byte ids are GPT-2's: ' ' is 220, '\n' 198). Those
 * are fixed below, so the test needs no Python. Beyond them: the merges
 * against a plain copy of encoder.py's loop on random merge tables, the
 * round trip of random bytes (invalid UTF-8 included), and a refusal with a
 * sentence for each kind of bad file.
 */
#include "harness.h"

#include <string.h>
#include <unistd.h>

#include "examples/gpt2/bpe.h"
#include "examples/gpt2/gpt2.h" // defines: gpt2_load_text

// ----------------------------------------------------------------------------
// writing the files

// GPT-2's byte-to-character mapping, written as encoder.py writes it: the
// printable bytes in order, then the others, numbered from U+0100. order[k]
// is the byte whose token has id k in GPT-2's vocabulary.
static uint32_t byte_cp[256];
static unsigned char order[256];

static void init_mapping(void) {
  int n = 0, extra = 0;
  for (int b = 0; b < 256; b++)
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
      byte_cp[b] = (uint32_t)b, order[n++] = (unsigned char)b;
  for (int b = 0; b < 256; b++)
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)))
      byte_cp[b] = 256 + (uint32_t)extra++, order[n++] = (unsigned char)b;
  assert_int_equal(n, 256);
}

typedef struct {
  char *p;
  size_t n, cap;
} Text;

static void put(Text *t, const char *s, size_t n) {
  if (t->n + n + 1 > t->cap) {
    t->cap = 2 * (t->n + n + 1);
    t->p = realloc(t->p, t->cap);
    assert_non_null(t->p);
  }
  memcpy(t->p + t->n, s, n);
  t->n += n;
  t->p[t->n] = '\0';
}
static void puts_(Text *t, const char *s) { put(t, s, strlen(s)); }

// A token's bytes in GPT-2's characters, as UTF-8, JSON-escaped when asked.
static void put_token(Text *t, const char *bytes, size_t n, int json) {
  for (size_t i = 0; i < n; i++) {
    uint32_t cp = byte_cp[(unsigned char)bytes[i]];
    char u[4];
    if (json && (cp == '"' || cp == '\\')) {
      put(t, "\\", 1);
      put(t, (const char *)&(char){(char)cp}, 1);
    } else if (cp < 0x80) {
      put(t, (const char *)&(char){(char)cp}, 1);
    } else {
      u[0] = (char)(0xC0 | cp >> 6);
      u[1] = (char)(0x80 | (cp & 0x3F));
      put(t, u, 2);
    }
  }
}

// A tokenizer's files: tokens [id] (bytes) and merges (pairs of bytes).
typedef struct {
  const char *left, *right;
} Merge;

static char dir[64];

static void write_file(const char *name, const char *text, size_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

// vocab.json: the 256 byte tokens in GPT-2's order (leaving out byte
// `skip`, when 0 to 255), then tokens[0..n), then `extra` JSON members.
static void write_vocab(const char *const *tokens, size_t n, int skip, const char *extra) {
  Text t = {0};
  int id = 0;
  puts_(&t, "{");
  for (int k = 0; k < 256; k++) {
    if (order[k] == skip) continue;
    puts_(&t, id ? ", \"" : "\"");
    put_token(&t, (const char *)&order[k], 1, 1);
    char num[32];
    snprintf(num, sizeof num, "\": %d", id++);
    puts_(&t, num);
  }
  for (size_t i = 0; i < n; i++) {
    puts_(&t, ",\n \"");
    put_token(&t, tokens[i], strlen(tokens[i]), 1);
    char num[32];
    snprintf(num, sizeof num, "\": %d", id++);
    puts_(&t, num);
  }
  if (extra) puts_(&t, extra);
  puts_(&t, "}\n");
  write_file("vocab.json", t.p, t.n);
  free(t.p);
}

static void write_merges(const Merge *m, size_t n) {
  Text t = {0};
  puts_(&t, "#version: 0.2\n");
  for (size_t i = 0; i < n; i++) {
    put_token(&t, m[i].left, strlen(m[i].left), 0);
    puts_(&t, " ");
    put_token(&t, m[i].right, strlen(m[i].right), 0);
    puts_(&t, "\n");
  }
  write_file("merges.txt", t.p ? t.p : "", t.n);
  free(t.p);
}

static int load(GPT2Bpe **bpe, char *err, size_t errlen) {
  char v[128], m[128];
  snprintf(v, sizeof v, "%s/vocab.json", dir);
  snprintf(m, sizeof m, "%s/merges.txt", dir);
  return gpt2_bpe_load(bpe, v, m, err, errlen);
}

// The mini tokenizer: made-up merges in the style of GPT-2's first ones,
// their joins as ids 256 onwards, then <|endoftext|>.
static const Merge mini_merges[] = {
    {" ", "t"},  {" ", "a"},   {"h", "e"},  {"i", "n"},       {"r", "e"},  {"o", "n"},
    {" t", "he"}, {"e", "r"},  {" ", "s"},  {"a", "t"},       {" ", " "},  {"'", "s"},
    {"'", "m"},  {"l", "l"},   {"'", "ll"}, {"  ", "  "},     {"\n", "\n"}, {"1", "2"},
    {"\xc3", "\xa9"}, {"\xe6", "\x97"}, {"\xe6\x97", "\xa5"}, {" ", "\xe6\x97\xa5"},
};
#define N_MINI (sizeof mini_merges / sizeof mini_merges[0])

static GPT2Bpe *load_mini(void) {
  const char *tokens[N_MINI];
  char joins[N_MINI][16];
  for (size_t i = 0; i < N_MINI; i++) {
    snprintf(joins[i], sizeof joins[i], "%s%s", mini_merges[i].left, mini_merges[i].right);
    tokens[i] = joins[i];
  }
  write_vocab(tokens, N_MINI, -1, ",\n \"<|endoftext|>\": 278");
  write_merges(mini_merges, N_MINI);
  GPT2Bpe *bpe = NULL;
  char err[512];
  int rc = load(&bpe, err, sizeof err);
  if (rc) print_error("%s\n", err);
  assert_int_equal(rc, 0);
  return bpe;
}

static void expect_ids(const GPT2Bpe *bpe, const char *text, const uint32_t *want, size_t n) {
  uint32_t *ids;
  size_t got;
  assert_int_equal(gpt2_bpe_encode(bpe, text, strlen(text), &ids, &got), 0);
  int same = got == n && memcmp(ids, want, n * sizeof *ids) == 0;
  if (!same) {
    print_error("\"%s\": got", text);
    for (size_t i = 0; i < got; i++) print_error(" %u", ids[i]);
    print_error(", want");
    for (size_t i = 0; i < n; i++) print_error(" %u", want[i]);
    print_error("\n");
  }
  free(ids);
  assert_true(same);
}
#define EXPECT_IDS(bpe, text, ...)                                                 \
  expect_ids((bpe), (text), (const uint32_t[]){__VA_ARGS__},                       \
             sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

// ----------------------------------------------------------------------------
// the pre-tokenizer

typedef struct {
  const char *text;
  const char *parts[8];
} Cut;

// From GPT-2's pattern in the regex module, except the invalid UTF-8 at the
// end, which Python never sees: each such byte counts as a character of no
// class, as U+FFFD would.
static const Cut cuts[] = {
    {"Hello world", {"Hello", " world"}},
    // Whitespace: a run gives its last space to the word after it.
    {"a  b", {"a", " ", " b"}},
    {"a   ", {"a", "   "}},
    {"  Hello", {" ", " Hello"}},
    {"a\n\nb", {"a", "\n", "\n", "b"}},
    {"a\n\n", {"a", "\n\n"}},
    {"\n\n\n", {"\n\n\n"}},
    {"a\t\tb", {"a", "\t", "\t", "b"}},
    {"a \t b", {"a", " \t", " b"}},
    {" \na", {" ", "\n", "a"}},
    {"x  ", {"x", "  "}},
    // Contractions: lowercase only, and only where a pre-token starts.
    {"I'm", {"I", "'m"}},
    {"don't", {"don", "'t"}},
    {"they'll", {"they", "'ll"}},
    {"we've", {"we", "'ve"}},
    {"you're", {"you", "'re"}},
    {"he'd", {"he", "'d"}},
    {"it's", {"it", "'s"}},
    {"HE'S", {"HE", "'", "S"}},
    {"'sup", {"'s", "up"}},
    {" 's", {" '", "s"}},
    {"!!'s", {"!!'", "s"}},
    {"''s", {"''", "s"}},
    // Letters beyond ASCII; combining marks are not \p{L}.
    {"caf\xc3\xa9", {"caf\xc3\xa9"}},
    {" \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa7\xe3\x81\x99",
     {" \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa7\xe3\x81\x99"}}, // " 日本語です"
    {"\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80", // हिन्दी
     {"\xe0\xa4\xb9", "\xe0\xa4\xbf", "\xe0\xa4\xa8", "\xe0\xa5\x8d", "\xe0\xa4\xa6",
      "\xe0\xa5\x80"}},
    {"e\xcc\x81t\xc3\xa9", {"e", "\xcc\x81", "t\xc3\xa9"}}, // e + U+0301, té
    {"hi \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd!", {"hi", " \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd!"}},
    // U+00A0 and U+2007 are \s (White_Space), though glibc's iswspace says no.
    {"a\xc2\xa0\xc2\xa0"
     "b",
     {"a", "\xc2\xa0", "\xc2\xa0", "b"}},
    {"a\xe2\x80\x87"
     "b",
     {"a", "\xe2\x80\x87", "b"}},
    // Numbers: digits of any script, fractions, superscripts, Roman numerals.
    {"abc123def", {"abc", "123", "def"}},
    {" 42x", {" 42", "x"}},
    {"x\xd9\xa3\xd9\xa4", {"x", "\xd9\xa3\xd9\xa4"}},
    {"1\xc2\xbd\xc2\xb2", {"1\xc2\xbd\xc2\xb2"}},
    {"\xe2\x85\xab!", {"\xe2\x85\xab", "!"}},
    // Punctuation runs.
    {"Hello!!!", {"Hello", "!!!"}},
    {"a, b.", {"a", ",", " b", "."}},
    {"x += 1;", {"x", " +=", " 1", ";"}},
    {"--> ", {"-->", " "}},
    {"$9.99", {"$", "9", ".", "99"}},
    // Invalid UTF-8.
    {"a\xff\xfe"
     "b",
     {"a", "\xff\xfe", "b"}},
    {" \xc3", {" \xc3"}},
    {"\xc0\xafx", {"\xc0\xaf", "x"}},
    {"\xed\xa0\x80!", {"\xed\xa0\x80!"}},
    {"\x80"
     "a",
     {"\x80", "a"}},
    {"\xe6\x97"
     "a",
     {"\xe6\x97", "a"}},
};

static void test_pretoken_cuts(void **state) {
  int bad = 0;
  for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
    const char *text = cuts[c].text;
    size_t len = strlen(text), at = 0, k = 0;
    int ok = 1;
    while (at < len) {
      size_t end = gpt2_bpe_pretoken(text, len, at);
      const char *want = k < 8 ? cuts[c].parts[k] : NULL;
      if (end <= at || end > len || !want || strlen(want) != end - at ||
          memcmp(want, text + at, end - at) != 0) {
        ok = 0;
        print_error("case %zu: part %zu is bytes %zu..%zu, want \"%s\"\n", c, k, at, end,
                    want ? want : "(no more)");
        break;
      }
      at = end;
      k++;
    }
    if (ok && k < 8 && cuts[c].parts[k]) {
      ok = 0;
      print_error("case %zu: %zu parts, want more\n", c, k);
    }
    bad += !ok;
  }
  assert_int_equal(bad, 0);
}

// ----------------------------------------------------------------------------
// the ids

static void test_byte_ids(void **state) {
  write_vocab(NULL, 0, -1, NULL);
  write_merges(NULL, 0);
  GPT2Bpe *bpe = NULL;
  char err[512];
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  assert_int_equal(gpt2_bpe_vocab_size(bpe), 256);
  // GPT-2's own ids for these bytes.
  EXPECT_IDS(bpe, "!", 0);
  EXPECT_IDS(bpe, "a", 64);
  EXPECT_IDS(bpe, " ", 220);
  EXPECT_IDS(bpe, "\n", 198);
  EXPECT_IDS(bpe, "\x7f", 221);
  EXPECT_IDS(bpe, "\xad", 255);
  EXPECT_IDS(bpe, "\xff", 187);
  // Every byte alone is its token: 0x00 is 188, the first of the 68.
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    uint32_t *ids;
    size_t n;
    assert_int_equal(gpt2_bpe_encode(bpe, &c, 1, &ids, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(order[ids[0]], b);
    free(ids);
  }
  gpt2_bpe_free(bpe);
}

static void test_mini_ids(void **state) {
  GPT2Bpe *bpe = load_mini();
  assert_int_equal(gpt2_bpe_vocab_size(bpe), 279);
  EXPECT_IDS(bpe, " the", 262);
  EXPECT_IDS(bpe, "the", 83, 258);
  EXPECT_IDS(bpe, "Hello there", 39, 68, 269, 78, 262, 260);
  EXPECT_IDS(bpe, "a  b", 64, 220, 220, 65);
  EXPECT_IDS(bpe, "a\n\nb", 64, 198, 198, 65);
  EXPECT_IDS(bpe, "a\n\n", 64, 272);
  EXPECT_IDS(bpe, "    x", 266, 220, 220, 87);
  EXPECT_IDS(bpe, "        ", 271, 271);
  EXPECT_IDS(bpe, "I'm", 40, 268);
  EXPECT_IDS(bpe, "they'll", 83, 258, 88, 270);
  EXPECT_IDS(bpe, "it's", 72, 83, 267);
  EXPECT_IDS(bpe, "HE'S", 39, 36, 6, 50);
  EXPECT_IDS(bpe, "caf\xc3\xa9", 66, 64, 69, 274);
  EXPECT_IDS(bpe, " \xe6\x97\xa5\xe6\x9c\xac", 277, 162, 250, 105); // " 日本"
  EXPECT_IDS(bpe, "\xe6\x97\xa5\xe6\x97\xa5", 276, 276);            // "日日"
  EXPECT_IDS(bpe, "12123", 273, 273, 18);
  // " a" (rank 1) is merged before "at" (rank 9) can be.
  EXPECT_IDS(bpe, "in the at", 259, 262, 257, 83);
  // The end-of-text token is looked up, not found in text.
  assert_int_equal(gpt2_bpe_token_id(bpe, "<|endoftext|>", 13), 278);
  assert_int_equal(gpt2_bpe_token_id(bpe, " the", 4), 262);
  assert_int_equal(gpt2_bpe_token_id(bpe, "xyz", 3), -ENOENT);
  EXPECT_IDS(bpe, "<|endoftext|>", 27, 91, 68, 77, 67, 78, 69, 83, 68, 87, 83, 91, 29);
  uint32_t *ids = (uint32_t *)1;
  size_t n = 1;
  assert_int_equal(gpt2_bpe_encode(bpe, "", 0, &ids, &n), 0);
  assert_null(ids);
  assert_int_equal(n, 0);
  gpt2_bpe_free(bpe);
}

// Which merge comes first decides: "abc" is "ab" "c" when "a b" ranks
// first and "a" "bc" when "b c" does. And a rank applies to all of its
// pairs, left to right, before any other: with "aa a" ranked above "a a",
// "aaaa" is "aa" "aa" (encoder.py merges both "a a" first), not "aaa" "a";
// "aaaaa" is "aa" "aa" "a", then "aa" "aaa". (Checked with encoder.py.)
static void test_merge_ranks(void **state) {
  const char *tokens[] = {"ab", "bc", "aa", "aaa"};
  write_vocab(tokens, 4, -1, NULL);
  char err[512];
  GPT2Bpe *bpe;
  const Merge ab_first[] = {{"a", "b"}, {"b", "c"}}, bc_first[] = {{"b", "c"}, {"a", "b"}};
  write_merges(ab_first, 2);
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  EXPECT_IDS(bpe, "abc", 256, 66);
  gpt2_bpe_free(bpe);
  write_merges(bc_first, 2);
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  EXPECT_IDS(bpe, "abc", 64, 257);
  gpt2_bpe_free(bpe);
  const Merge aa[] = {{"aa", "a"}, {"a", "a"}};
  write_merges(aa, 2);
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  EXPECT_IDS(bpe, "aaaa", 258, 258);
  EXPECT_IDS(bpe, "aaa", 259);
  EXPECT_IDS(bpe, "aaaaa", 258, 259);
  gpt2_bpe_free(bpe);
}

// encoder.py's bpe(), on ids: while some adjacent pair has a merge, take
// the lowest rank and rebuild the word merging its pairs left to right.
static size_t ref_bpe(const uint32_t (*m)[3], size_t nm, uint32_t *w, size_t n) {
  for (;;) {
    size_t best = nm;
    for (size_t i = 0; i + 1 < n; i++)
      for (size_t r = 0; r < best; r++)
        if (m[r][0] == w[i] && m[r][1] == w[i + 1]) best = r;
    if (best == nm) return n;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && w[i] == m[best][0] && w[i + 1] == m[best][1]) {
        w[o++] = m[best][2];
        i += 2;
      } else {
        w[o++] = w[i++];
      }
    }
    n = o;
  }
}

// Random merge tables over "abc", in the order they were made (each merge's
// tokens exist before it, as in a learned file) or shuffled (any order, as
// a file may hold), against ref_bpe on random words.
static void test_merges_against_reference(void **state) {
  enum { TABLES = 40, MERGES = 30, WORDS = 200 };
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0xb9e);
  for (int table = 0; table < TABLES; table++) {
    char tok[3 + MERGES][16] = {"a", "b", "c"};
    const char *extra[MERGES];
    Merge merges[MERGES];
    char left[MERGES][16], right[MERGES][16];
    uint32_t m[MERGES][3];
    size_t n_tok = 3, n_merges = 0, n_extra = 0;
    for (int tries = 0; n_merges < MERGES && tries < 1000; tries++) {
      size_t l = t_rng_next(&rng) % n_tok, r = t_rng_next(&rng) % n_tok;
      if (strlen(tok[l]) + strlen(tok[r]) > 8) continue;
      int dup = 0;
      for (size_t i = 0; i < n_merges; i++)
        dup |= strcmp(left[i], tok[l]) == 0 && strcmp(right[i], tok[r]) == 0;
      if (dup) continue;
      char join[24]; // two tokens of at most 8 bytes together
      snprintf(join, sizeof join, "%s%s", tok[l], tok[r]);
      size_t j = 0;
      while (j < n_tok && strcmp(tok[j], join) != 0) j++;
      if (j == n_tok) {
        strcpy(tok[n_tok++], join);
        extra[n_extra++] = tok[j];
      }
      strcpy(left[n_merges], tok[l]);
      strcpy(right[n_merges], tok[r]);
      n_merges++;
    }
    if (table % 2 && n_merges > 1) // shuffled
      for (size_t i = n_merges - 1; i > 0; i--) {
        size_t j = t_rng_next(&rng) % (i + 1);
        if (j == i) continue;
        char tmp[16];
        strcpy(tmp, left[i]), strcpy(left[i], left[j]), strcpy(left[j], tmp);
        strcpy(tmp, right[i]), strcpy(right[i], right[j]), strcpy(right[j], tmp);
      }
    // Ids: the bytes' GPT-2 ids ('a' 64), the joins 256 onwards.
    for (size_t i = 0; i < n_merges; i++) {
      merges[i] = (Merge){left[i], right[i]};
      const char *parts[3] = {left[i], right[i], NULL};
      char join[24];
      snprintf(join, sizeof join, "%s%s", left[i], right[i]);
      parts[2] = join;
      for (int k = 0; k < 3; k++) {
        size_t j = 0;
        while (j < n_tok && strcmp(tok[j], parts[k]) != 0) j++;
        m[i][k] = j < 3 ? (uint32_t)(64 + j) : (uint32_t)(256 + j - 3);
      }
    }
    write_vocab(extra, n_extra, -1, NULL);
    write_merges(merges, n_merges);
    GPT2Bpe *bpe;
    char err[512];
    assert_int_equal(load(&bpe, err, sizeof err), 0);
    for (int w = 0; w < WORDS; w++) {
      char word[41];
      uint32_t want[40];
      size_t n = 1 + t_rng_next(&rng) % 40;
      for (size_t i = 0; i < n; i++) {
        word[i] = (char)('a' + t_rng_next(&rng) % 3);
        want[i] = (uint32_t)(64 + word[i] - 'a');
      }
      word[n] = '\0';
      size_t nw = ref_bpe((const uint32_t(*)[3])m, n_merges, want, n);
      uint32_t *ids;
      size_t got;
      assert_int_equal(gpt2_bpe_encode(bpe, word, n, &ids, &got), 0);
      if (got != nw || memcmp(ids, want, nw * sizeof *ids) != 0) {
        print_error("table %d (%s), word %s: %zu ids, want %zu\n", table,
                    table % 2 ? "shuffled" : "learned order", word, got, nw);
        fail();
      }
      free(ids);
    }
    gpt2_bpe_free(bpe);
  }
}

// decode(encode(x)) == x for random bytes (mostly invalid UTF-8) and for
// random strings of the characters the pre-tokenizer treats apart.
static void test_round_trip(void **state) {
  static const char *const pieces[] = {
      " ", "  ", "\n", "\n\n", "\t", "\r\n", "a", "the", " the", "I", "'s", "'ll", "'S",
      "1", "12", "!", "...", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x91\x8b", "\xc2\xa0",
      "\xe0\xa4\xbf", "\xff", "\x80", "\xe6\x97", "\0", "<|endoftext|>"};
  const size_t n_pieces = sizeof pieces / sizeof pieces[0];
  GPT2Bpe *bpe = load_mini();
  t_rng_t rng;
  t_rng_init(&rng, t_seed() ^ 0x707);
  for (int iter = 0; iter < 4000; iter++) {
    unsigned char text[1024];
    size_t len = 0;
    if (iter % 2) {
      len = t_rng_next(&rng) % 200;
      t_fill_bits(text, len, &rng);
    } else {
      for (int k = (int)(t_rng_next(&rng) % 40); k > 0; k--) {
        const char *p = pieces[t_rng_next(&rng) % n_pieces];
        size_t pn = *p ? strlen(p) : 1; // "\0": one NUL byte
        memcpy(text + len, p, pn);
        len += pn;
      }
    }
    uint32_t *ids;
    size_t n;
    assert_int_equal(gpt2_bpe_encode(bpe, (const char *)text, len, &ids, &n), 0);
    assert_true(n <= len);
    char *back;
    size_t back_len;
    assert_int_equal(gpt2_bpe_decode(bpe, ids, n, &back, &back_len), 0);
    assert_int_equal(back_len, len);
    assert_memory_equal(back, text, len);
    assert_int_equal(back[len], '\0');
    free(ids);
    free(back);
  }
  // An id past the vocabulary is refused.
  uint32_t bad[] = {64, 279};
  char *back = (char *)1;
  size_t back_len = 1;
  assert_int_equal(gpt2_bpe_decode(bpe, bad, 2, &back, &back_len), -EINVAL);
  assert_null(back);
  assert_int_equal(back_len, 0);
  gpt2_bpe_free(bpe);
}

// ----------------------------------------------------------------------------
// bad files

// Loads what the files hold now and wants `rc`, no tokenizer, and a
// sentence holding `needle` and `needle2` (unless NULL).
static void expect_refusal(int rc, const char *needle, const char *needle2) {
  GPT2Bpe *bpe = (GPT2Bpe *)1;
  char err[512];
  int got = load(&bpe, err, sizeof err);
  print_message("# refused (%d): %s\n", got, err);
  assert_int_equal(got, rc);
  assert_null(bpe);
  assert_non_null(strstr(err, needle));
  if (needle2) assert_non_null(strstr(err, needle2));
}

static void test_refusals(void **state) {
  char path[128];
  const char *ab[] = {"ab"};
  const Merge ab_merge[] = {{"a", "b"}};
  write_vocab(ab, 1, -1, NULL);
  write_merges(ab_merge, 1);
  GPT2Bpe *bpe;
  char err[512];
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  gpt2_bpe_free(bpe);
  gpt2_bpe_free(NULL);

  // Files that are not there.
  snprintf(path, sizeof path, "%s/merges.txt", dir);
  unlink(path);
  expect_refusal(-ENOENT, "merges.txt", "No such file");
  write_merges(ab_merge, 1);
  snprintf(path, sizeof path, "%s/vocab.json", dir);
  unlink(path);
  expect_refusal(-ENOENT, "vocab.json", "No such file");
  bpe = (GPT2Bpe *)1;
  assert_int_equal(gpt2_bpe_load(&bpe, dir, path, NULL, 0), -EISDIR); // no err buffer
  assert_null(bpe);

  // vocab.json that is not a vocabulary.
  write_file("vocab.json", "", 0);
  expect_refusal(-EINVAL, "vocab.json:1:1", "not valid JSON");
  write_file("vocab.json", "{\"a\": 1,\n \"b\" 2}", 16);
  expect_refusal(-EINVAL, "vocab.json:2:", "not valid JSON");
  write_file("vocab.json", "{\"a\": 0}\0", 9);
  expect_refusal(-EINVAL, "vocab.json", "NUL byte at offset 8");
  write_file("vocab.json", "[0, 1]", 6);
  expect_refusal(-EINVAL, "vocab.json", "expected a JSON object");
  write_vocab(ab, 1, -1, ",\n \"zz\": 1.5");
  expect_refusal(-EINVAL, "\"zz\"", "expected an integer id from 0 to 257");
  write_vocab(ab, 1, -1, ",\n \"zz\": \"257\"");
  expect_refusal(-EINVAL, "\"zz\"", "expected an integer id");
  write_vocab(ab, 1, -1, ",\n \"zz\": 258");
  expect_refusal(-EINVAL, "\"zz\"", "expected an integer id from 0 to 257");
  write_vocab(ab, 1, -1, ",\n \"zz\": 256");
  expect_refusal(-EINVAL, "id 256 is given twice", NULL);
  write_vocab(ab, 1, -1, ",\n \"a b\": 257"); // a real space: GPT-2 spells it U+0120
  expect_refusal(-EINVAL, "\"a b\"", "U+0020");
  write_vocab(ab, 1, -1, ",\n \"\xc4\xa0\xff\": 257");
  expect_refusal(-EINVAL, "is not valid UTF-8", NULL);
  write_vocab(ab, 1, -1, ",\n \"a\\u0062\": 257"); // "ab" again, escaped
  expect_refusal(-EINVAL, "\"ab\" is given twice (ids 256 and 257)", NULL);
  write_vocab(ab, 1, 'q', ",\n \"zz\": 256");
  expect_refusal(-EINVAL, "no token for byte 0x71", NULL);
  write_vocab(ab, 1, -1, NULL);

  // merges.txt lines that are not merges: each names its line.
  write_file("merges.txt", "#version: 0.2\na b\nab\n", 21);
  expect_refusal(-EINVAL, "merges.txt:3:", "expected two tokens separated by one space");
  write_file("merges.txt", "a b\na b c\n", 10);
  expect_refusal(-EINVAL, "merges.txt:2:", "expected two tokens separated by one space");
  write_file("merges.txt", "a b\n\na b\n", 9);
  expect_refusal(-EINVAL, "merges.txt:2:", "expected two tokens");
  write_file("merges.txt", "a  b\n", 5);
  expect_refusal(-EINVAL, "merges.txt:1:", "expected two tokens");
  write_file("merges.txt", "#version: 0.2\na b\na zz\n", 23);
  expect_refusal(-EINVAL, "merges.txt:3:", "token \"zz\" is not in the vocabulary");
  write_file("merges.txt", "b a\n", 4);
  expect_refusal(-EINVAL, "merges.txt:1:", "join is not in the vocabulary");
  write_file("merges.txt", "a\tb c\n", 6);
  expect_refusal(-EINVAL, "merges.txt:1:", "U+0009");
  write_file("merges.txt", "a b\r\n#version: 0.2\n", 19); // only the first line may be one
  expect_refusal(-EINVAL, "merges.txt:2:", "\"#version:\" is not in the vocabulary");
  write_file("merges.txt", "a\0 b\n", 5);
  expect_refusal(-EINVAL, "merges.txt:1:", "NUL byte");

  // Accepted: CRLF line ends, no "#version" line, no newline at the end,
  // an empty file (no merges).
  write_file("merges.txt", "a b\r\n", 5);
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  EXPECT_IDS(bpe, "ab", 256);
  gpt2_bpe_free(bpe);
  write_file("merges.txt", "a b", 3);
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  EXPECT_IDS(bpe, "ab", 256);
  gpt2_bpe_free(bpe);
  write_file("merges.txt", "", 0);
  assert_int_equal(load(&bpe, err, sizeof err), 0);
  EXPECT_IDS(bpe, "ab", 64, 65);
  gpt2_bpe_free(bpe);
}

// The example's --tokenizer: a text file in the tokenizer's ids, each
// checked against the model's vocabulary.
static void test_load_text(void **state) {
  GPT2Bpe *bpe = load_mini();
  const char *text = "Hello there, I'm in the caf\xc3\xa9.\n\n  they'll 12123";
  write_file("text.txt", text, strlen(text));
  char path[128];
  snprintf(path, sizeof path, "%s/text.txt", dir);
  uint32_t *want = NULL;
  size_t n = 0;
  assert_int_equal(gpt2_bpe_encode(bpe, text, strlen(text), &want, &n), 0);
  uint32_t top = 0;
  for (size_t i = 0; i < n; i++) top = want[i] > top ? want[i] : top;
  assert_true(top >= 256); /* merged tokens in it */
  // A vocabulary of top + 1 ids holds them all.
  GPT2Tokens tok;
  assert_int_equal(gpt2_load_text(path, bpe, (int)top + 1, &tok), 0);
  assert_int_equal(tok.n, n);
  for (size_t i = 0; i < n; i++) assert_int_equal(tok.ids[i], (int)want[i]);
  gpt2_free_tokens(&tok);
  // One of `top` ids (a model smaller than the tokenizer) does not: refused,
  // and nothing is handed out.
  assert_int_equal(gpt2_load_text(path, bpe, (int)top, &tok), -1);
  assert_null(tok.ids);
  assert_int_equal(tok.n, 0);
  snprintf(path, sizeof path, "%s/missing.txt", dir);
  assert_int_equal(gpt2_load_text(path, bpe, 279, &tok), -1);
  free(want);
  gpt2_bpe_free(bpe);
}

int main(void) {
  init_mapping();
  snprintf(dir, sizeof dir, "/tmp/zt-test-bpe-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pretoken_cuts),
      cmocka_unit_test(test_byte_ids),
      cmocka_unit_test(test_mini_ids),
      cmocka_unit_test(test_merge_ranks),
      cmocka_unit_test(test_merges_against_reference),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_load_text),
  };
  int rc = T_RUN(tests);
  t_remove_tree(dir);
  return rc;
}
