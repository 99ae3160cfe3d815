/*
 * examples/gpt2/bpe.c — GPT-2's byte-level BPE tokenizer (bpe.h): loading
 * vocab.json and merges.txt, the pre-tokenizer, the merges, decoding.
 *
 * Tokens are kept as the bytes they stand for, not as the characters of
 * vocab.json: GPT-2 maps each byte to a printable character
 * (bytes_to_unicode in encoder.py) only so that its files hold text; a
 * token's characters are mapped back to bytes as the files are read, and
 * everything after works on bytes.
 *
 * The pre-tokenizer is GPT-2's regular expression written out by hand
 * (gpt2_bpe_pretoken). \p{L}, \p{N} and \s are Unicode's classes as the
 * Python `regex` module that encoder.py uses defines them: \s is the
 * White_Space property (25 code points), \p{L} and \p{N} come from the
 * tables of bpe_unicode.c. glibc's iswalpha and iswspace (C.UTF-8) are not
 * used: iswalpha holds combining marks (Devanagari's vowel signs) and every
 * non-ASCII digit, and iswspace leaves out U+0085 and the no-break spaces,
 * so they cut Hindi, Arabic digits and U+00A0 runs otherwise than GPT-2
 * does (docs/tokenizer.md). A byte that does not start a valid UTF-8
 * sequence (a stray continuation byte, an overlong form, a surrogate, past
 * U+10FFFF, a sequence cut short) counts as one character of its own in
 * none of the three classes, as U+FFFD would; GPT-2 never sees such text,
 * since Python decodes it first.
 *
 * The merges: GPT-2 applies, in turn, the lowest-ranked pair present,
 * every occurrence of it left to right. bpe_word does the same with a heap
 * of (rank, position), O(n log n) in the pre-token's length where the
 * literal loop is O(n^2) (a long run of punctuation or digits is one
 * pre-token).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h> // defines: cJSON

#include "bpe.h" // defines: GPT2Bpe

#define NO_ID UINT32_MAX

typedef struct {
  uint64_t pair;   // left id << 32 | right id; UINT64_MAX: an empty slot
  uint32_t rank;   // the line's index among the merges
  uint32_t merged; // the id of the two tokens' join
} MergeSlot;

struct GPT2Bpe {
  uint32_t n_vocab;
  char *bytes;          // every token's bytes, in vocab.json's order
  uint32_t *tok_off;    // [n_vocab]: id's bytes are bytes[tok_off[id]], tok_len[id] of them
  uint32_t *tok_len;    // [n_vocab]
  uint32_t *vocab_slot; // open addressing over the tokens' bytes: ids, NO_ID empty
  size_t vocab_mask;
  MergeSlot *merge_slot; // open addressing over (left, right)
  size_t merge_mask;
  uint32_t byte_id[256]; // the token of each single byte
};


// ----------------------------------------------------------------------------
// GPT-2's byte <-> character mapping

// bytes_to_unicode: the printable Latin-1 bytes (0x21-0x7E, 0xA1-0xAC,
// 0xAE-0xFF) stand for themselves; the other 68 (0x00-0x20, 0x7F-0xA0,
// 0xAD) for U+0100 onwards, in byte order. So ' ' is 'Ġ' (U+0120), '\n' is
// 'Ċ' (U+010A) and 0xAD is 'Ń' (U+0143).
static uint32_t byte_char(unsigned b) {
  if (b <= 0x20) return 0x100 + b;
  if (b >= 0x7F && b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
  if (b == 0xAD) return 0x100 + 67;
  return b;
}

// The byte a character stands for, or -1 when it stands for none.
static int char_byte(uint32_t cp) {
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
    return (int)cp;
  if (cp < 0x100 || cp >= 0x100 + 68) return -1;
  unsigned k = cp - 0x100;
  return k < 33 ? (int)k : k < 67 ? (int)(0x7F + k - 33) : 0xAD;
}

// ----------------------------------------------------------------------------
// UTF-8 and the character classes

enum { CLS_OTHER, CLS_LETTER, CLS_NUMBER, CLS_SPACE };

// Decodes the character at s[0..n) (n >= 1): its length in bytes, and the
// code point in *cp, or UINT32_MAX for a byte that starts no valid sequence
// (then the length is 1).
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned c = s[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    *cp = UINT32_MAX;
    return 1;
  }
  if (n < len) {
    *cp = UINT32_MAX;
    return 1;
  }
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) {
      *cp = UINT32_MAX;
      return 1;
    }
    v = v << 6 | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    *cp = UINT32_MAX;
    return 1;
  }
  *cp = v;
  return len;
}

// \s: Unicode's White_Space, which is what the regex module's \s matches
// (not Python's str.isspace, which adds U+001C..U+001F).
static int is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int char_class(uint32_t cp) {
  if (cp == UINT32_MAX) return CLS_OTHER;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CLS_LETTER;
    if (cp >= '0' && cp <= '9') return CLS_NUMBER;
    return is_space(cp) ? CLS_SPACE : CLS_OTHER;
  }
  if (is_space(cp)) return CLS_SPACE;
  if (gpt2_bpe_is_letter(cp)) return CLS_LETTER;
  if (gpt2_bpe_is_number(cp)) return CLS_NUMBER;
  return CLS_OTHER;
}

// The class of the character at s[i..n) and, in *next, where it ends.
static int class_at(const unsigned char *s, size_t n, size_t i, size_t *next) {
  uint32_t cp;
  *next = i + utf8_next(s + i, n - i, &cp);
  return char_class(cp);
}

// Where the run of characters of class `cls` that starts at i ends.
static size_t run_end(const unsigned char *s, size_t n, size_t i, int cls) {
  size_t next;
  while (i < n && class_at(s, n, i, &next) == cls) i = next;
  return i;
}

// ----------------------------------------------------------------------------
// the pre-tokenizer

// GPT-2's pattern tries its alternatives in order at each position and
// takes the first that matches; written out:
//   's 't 're 've 'm 'll 'd  an apostrophe (U+0027 only) and these
//                            lowercase letters, whatever follows ("'sup"
//                            gives "'s" "up"; "'S" is not one: "'" "S");
//   ?\p{L}+ ?\p{N}+ ?[^\s\p{L}\p{N}]+
//                            a run of one class, with one U+0020 before it
//                            when there is one: the space joins the word
//                            after it;
//   \s+(?!\S)                whitespace up to the end of the text, or all
//                            of a run but its last character when a
//                            non-space follows: that last character is
//                            left to the next match, where a U+0020 joins
//                            the word (so "a   b" is "a" "  " " b");
//   \s+                      a single whitespace character before a
//                            non-space ("\n" before "b"), which no other
//                            alternative takes.
size_t gpt2_bpe_pretoken(const char *text, size_t len, size_t start) {
  const unsigned char *s = (const unsigned char *)text;
  if (start >= len) return len;
  if (s[start] == '\'' && start + 1 < len) {
    const char *rest = text + start + 1;
    size_t left = len - start - 1;
    if (rest[0] != '\0' && strchr("stmd", rest[0])) return start + 2;
    if (left >= 2 && (memcmp(rest, "re", 2) == 0 || memcmp(rest, "ve", 2) == 0 ||
                      memcmp(rest, "ll", 2) == 0))
      return start + 3;
  }
  size_t next;
  int cls = class_at(s, len, start, &next);
  if (s[start] == ' ' && next < len) {
    size_t after;
    int cls2 = class_at(s, len, next, &after);
    if (cls2 != CLS_SPACE) return run_end(s, len, after, cls2);
  }
  if (cls != CLS_SPACE) return run_end(s, len, next, cls);
  size_t end = run_end(s, len, next, CLS_SPACE);
  if (end == len || next == end) return end;
  // Step back one character: over its continuation bytes, then its lead.
  size_t last = end - 1;
  while ((s[last] & 0xC0) == 0x80) last--;
  return last;
}

// ----------------------------------------------------------------------------
// the tables

static uint64_t hash_bytes(const char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull; // FNV-1a
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t pair) {
  pair *= 0x9e3779b97f4a7c15ull;
  return pair ^ (pair >> 31);
}

// The slot of the token whose bytes are p[0..n): the one holding it, or the
// empty one where it would go.
static size_t vocab_find(const GPT2Bpe *bpe, const char *p, size_t n) {
  size_t i = hash_bytes(p, n) & bpe->vocab_mask;
  for (;; i = (i + 1) & bpe->vocab_mask) {
    uint32_t id = bpe->vocab_slot[i];
    if (id == NO_ID ||
        (bpe->tok_len[id] == n && memcmp(bpe->bytes + bpe->tok_off[id], p, n) == 0))
      return i;
  }
}

static const MergeSlot *merge_find(const GPT2Bpe *bpe, uint32_t left, uint32_t right) {
  uint64_t pair = (uint64_t)left << 32 | right;
  for (size_t i = hash_pair(pair) & bpe->merge_mask;; i = (i + 1) & bpe->merge_mask) {
    const MergeSlot *m = &bpe->merge_slot[i];
    if (m->pair == pair) return m;
    if (m->pair == UINT64_MAX) return NULL;
  }
}

// Room for n entries at most half full: a power of two, 2n or more.
static size_t table_size(size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;
  return size;
}

// ----------------------------------------------------------------------------
// loading

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

// A token as the file spells it, for a message: quoted, at most about 40
// bytes, control characters and bytes that are not UTF-8 as \xNN.
static const char *show(const char *s, size_t n, char *buf, size_t cap) {
  size_t o = 0;
  buf[o++] = '"';
  for (size_t i = 0; i < n && o + 8 < cap;) {
    uint32_t cp;
    size_t len = utf8_next((const unsigned char *)s + i, n - i, &cp);
    if (i >= 40) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    if (cp == UINT32_MAX || cp < 0x20 || cp == 0x7F) {
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", (unsigned char)s[i]);
    } else {
      memcpy(buf + o, s + i, len);
      o += len;
    }
    i += len;
  }
  buf[o++] = '"';
  buf[o] = '\0';
  return buf;
}
#define SHOW(s, n) show((s), (n), (char[64]){0}, 64)

// The file at `path` with a '\0' after it, or NULL with errno set. Read
// in chunks rather than by its size: a directory opens, and then fails
// here with EISDIR, where its "size" would have been taken at face value.
static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  int e = buf ? 0 : ENOMEM;
  while (buf) {
    len += fread(buf + len, 1, cap - 1 - len, f);
    if (len < cap - 1) break; // the end, or an error
    char *more = cap <= SIZE_MAX / 2 ? realloc(buf, cap *= 2) : NULL;
    if (!more) {
      free(buf);
      buf = NULL;
      e = ENOMEM;
    }
    buf = more;
  }
  if (buf && ferror(f)) {
    e = errno ? errno : EIO;
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (!buf) {
    errno = e;
    return NULL;
  }
  buf[len] = '\0';
  *n = len;
  return buf;
}

// A token's characters s[0..n) (UTF-8, as vocab.json and merges.txt spell
// it) to the bytes they stand for, into out (n bytes of room: a character
// is never shorter than its byte). Returns the byte count, or -1 with the
// first character that stands for no byte in *bad (UINT32_MAX: not UTF-8).
static long token_bytes(const char *s, size_t n, char *out, uint32_t *bad) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += utf8_next((const unsigned char *)s + i, n - i, &cp);
    int b = cp == UINT32_MAX ? -1 : char_byte(cp);
    if (b < 0) {
      *bad = cp;
      return -1;
    }
    out[o++] = (char)b;
  }
  return (long)o;
}

static int bad_char(char *err, size_t errlen, const char *where, const char *tok, size_t n,
                    uint32_t bad) {
  if (bad == UINT32_MAX)
    return fail(err, errlen, -EINVAL, "%s: token %s is not valid UTF-8", where, SHOW(tok, n));
  return fail(err, errlen, -EINVAL,
              "%s: token %s holds U+%04X, which is not one of GPT-2's 256 byte characters "
              "(a byte-level vocabulary spells space as U+0120 and newline as U+010A)",
              where, SHOW(tok, n), (unsigned)bad);
}

static void line_col(const char *text, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off && text[i]; i++) {
    if (text[i] == '\n') {
      ++*line;
      *col = 1;
    } else {
      ++*col;
    }
  }
}

static int load_vocab(GPT2Bpe *bpe, const char *path, char *err, size_t errlen) {
  size_t n = 0;
  char *text = slurp(path, &n);
  if (!text) {
    int e = errno ? errno : EIO;
    return fail(err, errlen, -e, "%s: %s; expected the vocabulary, vocab.json", path,
                strerror(e));
  }
  size_t nul = strlen(text);
  if (nul != n) {
    free(text);
    return fail(err, errlen, -EINVAL, "%s: a NUL byte at offset %zu; expected JSON text", path,
                nul);
  }
  // cJSON keeps the position of its last error in a global; the position
  // is read from `end` instead, but two loads on two threads at once still
  // race on that global (the example loads once, before anything else).
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (!root) {
    int line, col;
    line_col(text, end ? (size_t)(end - text) : 0, &line, &col);
    free(text);
    return fail(err, errlen, -EINVAL, "%s:%d:%d: not valid JSON; expected an object from "
                "each token to its id", path, line, col);
  }
  int rc = 0;
  size_t count = 0, chars = 0;
  const cJSON *it;
  if (!cJSON_IsObject(root)) {
    rc = fail(err, errlen, -EINVAL, "%s: expected a JSON object from each token to its id",
              path);
    goto out;
  }
  cJSON_ArrayForEach(it, root) {
    count++;
    chars += strlen(it->string);
  }
  if (count == 0 || count >= NO_ID || chars >= UINT32_MAX) {
    rc = fail(err, errlen, -EINVAL, "%s: %zu tokens; expected one for each byte and more",
              path, count);
    goto out;
  }
  bpe->n_vocab = (uint32_t)count;
  bpe->vocab_mask = table_size(count) - 1;
  bpe->bytes = malloc(chars + 1);
  bpe->tok_off = malloc(count * sizeof *bpe->tok_off);
  bpe->tok_len = malloc(count * sizeof *bpe->tok_len);
  bpe->vocab_slot = malloc((bpe->vocab_mask + 1) * sizeof *bpe->vocab_slot);
  if (!bpe->bytes || !bpe->tok_off || !bpe->tok_len || !bpe->vocab_slot) {
    rc = fail(err, errlen, -ENOMEM, "%s: out of memory for %zu tokens", path, count);
    goto out;
  }
  memset(bpe->vocab_slot, 0xFF, (bpe->vocab_mask + 1) * sizeof *bpe->vocab_slot);
  // tok_len doubles as "this id was seen" until every id is in.
  for (size_t i = 0; i < count; i++) bpe->tok_len[i] = NO_ID;
  size_t used = 0;
  cJSON_ArrayForEach(it, root) {
    const char *tok = it->string;
    size_t tn = strlen(tok);
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || v < 0 || v >= (double)count || v != (double)(uint32_t)v) {
      rc = fail(err, errlen, -EINVAL, "%s: token %s: expected an integer id from 0 to %zu "
                "(ids 0 to n-1, each once)", path, SHOW(tok, tn), count - 1);
      goto out;
    }
    uint32_t id = (uint32_t)v, bad;
    if (bpe->tok_len[id] != NO_ID) {
      rc = fail(err, errlen, -EINVAL, "%s: id %u is given twice; expected ids 0 to %zu, "
                "each once", path, id, count - 1);
      goto out;
    }
    long bn = token_bytes(tok, tn, bpe->bytes + used, &bad);
    if (bn < 0) {
      rc = bad_char(err, errlen, path, tok, tn, bad);
      goto out;
    }
    bpe->tok_off[id] = (uint32_t)used;
    bpe->tok_len[id] = (uint32_t)bn;
    size_t slot = vocab_find(bpe, bpe->bytes + used, (size_t)bn);
    if (bpe->vocab_slot[slot] != NO_ID) {
      rc = fail(err, errlen, -EINVAL, "%s: token %s is given twice (ids %u and %u)", path,
                SHOW(tok, tn), bpe->vocab_slot[slot], id);
      goto out;
    }
    bpe->vocab_slot[slot] = id;
    used += (size_t)bn;
  }
  for (unsigned b = 0; b < 256; b++) {
    char c = (char)b;
    bpe->byte_id[b] = bpe->vocab_slot[vocab_find(bpe, &c, 1)];
    if (bpe->byte_id[b] == NO_ID) {
      rc = fail(err, errlen, -EINVAL, "%s: no token for byte 0x%02x (the character U+%04X); "
                "expected one for each of the 256 bytes", path, b, (unsigned)byte_char(b));
      goto out;
    }
  }
out:
  cJSON_Delete(root);
  free(text);
  return rc;
}

// One line of merges.txt, s[0..n) without its newline, merge number `rank`.
static int add_merge(GPT2Bpe *bpe, const char *path, int line, char *s, size_t n,
                     uint32_t rank, char *err, size_t errlen) {
  char *sep = memchr(s, ' ', n);
  if (!sep || sep == s || sep == s + n - 1 || memchr(sep + 1, ' ', (size_t)(s + n - sep - 1)))
    return fail(err, errlen, -EINVAL, "%s:%d: %s: expected two tokens separated by one space",
                path, line, SHOW(s, n));
  const char *part[2] = {s, sep + 1};
  size_t part_n[2] = {(size_t)(sep - s), (size_t)(s + n - sep - 1)};
  uint32_t id[2], bad;
  char joined[2 * 4096];
  size_t jn = 0;
  for (int k = 0; k < 2; k++) {
    char *b = joined + jn;
    if (part_n[k] > sizeof joined / 2)
      return fail(err, errlen, -EINVAL, "%s:%d: token %s is longer than %zu bytes", path, line,
                  SHOW(part[k], part_n[k]), sizeof joined / 2);
    long bn = token_bytes(part[k], part_n[k], b, &bad);
    if (bn < 0) {
      char where[4096];
      snprintf(where, sizeof where, "%s:%d", path, line);
      return bad_char(err, errlen, where, part[k], part_n[k], bad);
    }
    id[k] = bpe->vocab_slot[vocab_find(bpe, b, (size_t)bn)];
    if (id[k] == NO_ID)
      return fail(err, errlen, -EINVAL, "%s:%d: token %s is not in the vocabulary; expected "
                  "a merge of two tokens of vocab.json", path, line, SHOW(part[k], part_n[k]));
    jn += (size_t)bn;
  }
  uint32_t merged = bpe->vocab_slot[vocab_find(bpe, joined, jn)];
  if (merged == NO_ID)
    return fail(err, errlen, -EINVAL, "%s:%d: %s: the two tokens' join is not in the "
                "vocabulary; expected every merge's result to be a token", path, line,
                SHOW(s, n));
  // A pair given twice keeps its later rank, as encoder.py's dict does.
  uint64_t pair = (uint64_t)id[0] << 32 | id[1];
  size_t i = hash_pair(pair) & bpe->merge_mask;
  while (bpe->merge_slot[i].pair != UINT64_MAX && bpe->merge_slot[i].pair != pair)
    i = (i + 1) & bpe->merge_mask;
  bpe->merge_slot[i] = (MergeSlot){.pair = pair, .rank = rank, .merged = merged};
  return 0;
}

static int load_merges(GPT2Bpe *bpe, const char *path, char *err, size_t errlen) {
  size_t n = 0;
  char *text = slurp(path, &n);
  if (!text) {
    int e = errno ? errno : EIO;
    return fail(err, errlen, -e, "%s: %s; expected the merges, merges.txt", path, strerror(e));
  }
  size_t lines = 1;
  for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
  bpe->merge_mask = table_size(lines) - 1;
  bpe->merge_slot = malloc((bpe->merge_mask + 1) * sizeof *bpe->merge_slot);
  if (!bpe->merge_slot) {
    free(text);
    return fail(err, errlen, -ENOMEM, "%s: out of memory for %zu merges", path, lines);
  }
  memset(bpe->merge_slot, 0xFF, (bpe->merge_mask + 1) * sizeof *bpe->merge_slot);
  int rc = 0, line = 0;
  uint32_t rank = 0;
  for (size_t at = 0; at < n && rc == 0;) {
    char *s = text + at, *nl = memchr(s, '\n', n - at);
    size_t len = nl ? (size_t)(nl - s) : n - at;
    at += len + (nl != NULL);
    line++;
    if (len && s[len - 1] == '\r') len--;
    if (line == 1 && len >= 8 && memcmp(s, "#version", 8) == 0) continue;
    if (memchr(s, '\0', len))
      rc = fail(err, errlen, -EINVAL, "%s:%d: a NUL byte; expected two tokens separated by "
                "one space", path, line);
    else
      rc = add_merge(bpe, path, line, s, len, rank++, err, errlen);
  }
  free(text);
  return rc;
}

int gpt2_bpe_load(GPT2Bpe **out, const char *vocab_json, const char *merges_txt, char *err,
                  size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = '\0';
  GPT2Bpe *bpe = calloc(1, sizeof *bpe);
  if (!bpe) return fail(err, errlen, -ENOMEM, "out of memory");
  int rc = load_vocab(bpe, vocab_json, err, errlen);
  if (rc == 0) rc = load_merges(bpe, merges_txt, err, errlen);
  if (rc != 0) {
    gpt2_bpe_free(bpe);
    return rc;
  }
  *out = bpe;
  return 0;
}

void gpt2_bpe_free(GPT2Bpe *bpe) {
  if (!bpe) return;
  free(bpe->bytes);
  free(bpe->tok_off);
  free(bpe->tok_len);
  free(bpe->vocab_slot);
  free(bpe->merge_slot);
  free(bpe);
}

size_t gpt2_bpe_vocab_size(const GPT2Bpe *bpe) { return bpe->n_vocab; }

int gpt2_bpe_token_id(const GPT2Bpe *bpe, const char *bytes, size_t len) {
  uint32_t id = bpe->vocab_slot[vocab_find(bpe, bytes, len)];
  return id == NO_ID ? -ENOENT : (int)id;
}

// ----------------------------------------------------------------------------
// encoding

// A growing array of ids.
typedef struct {
  uint32_t *ids;
  size_t n, cap;
} Ids;

static int ids_push(Ids *o, uint32_t id) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? 2 * o->cap : 256;
    uint32_t *ids = realloc(o->ids, cap * sizeof *ids);
    if (!ids) return -ENOMEM;
    o->ids = ids;
    o->cap = cap;
  }
  o->ids[o->n++] = id;
  return 0;
}

// A pair that has a merge: at symbol `pos` (a position in the pre-token,
// which stays the merged symbol's), the ids it had when it was found.
typedef struct {
  uint32_t rank, left, right, merged;
  size_t pos;
} Pair;

#define END SIZE_MAX

// One pre-token's symbols, a list threaded through arrays indexed by the
// byte each symbol starts at; the heap of pairs to merge, and the pairs
// found during the current rank's merges. Kept from word to word.
typedef struct {
  uint32_t *id; // NO_ID: merged into the symbol before it
  size_t *next, *prev;
  size_t cap;
  Pair *heap, *found;
  size_t heap_n, found_n;
} Work;

static int work_reserve(Work *w, size_t n) {
  if (n <= w->cap) return 0;
  free(w->id);
  free(w->next);
  free(w->prev);
  free(w->heap);
  free(w->found);
  // Each merge finds at most two pairs: 3n pairs in the heap over a word.
  w->id = malloc(n * sizeof *w->id);
  w->next = malloc(n * sizeof *w->next);
  w->prev = malloc(n * sizeof *w->prev);
  w->heap = malloc(3 * n * sizeof *w->heap);
  w->found = malloc(2 * n * sizeof *w->found);
  w->cap = n;
  if (w->id && w->next && w->prev && w->heap && w->found) return 0;
  w->cap = 0;
  return -ENOMEM;
}

static void work_free(Work *w) {
  free(w->id);
  free(w->next);
  free(w->prev);
  free(w->heap);
  free(w->found);
}

static int pair_before(const Pair *a, const Pair *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(Work *w, Pair p) {
  size_t i = w->heap_n++;
  while (i > 0 && pair_before(&p, &w->heap[(i - 1) / 2])) {
    w->heap[i] = w->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  w->heap[i] = p;
}

static Pair heap_pop(Work *w) {
  Pair top = w->heap[0], last = w->heap[--w->heap_n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= w->heap_n) break;
    if (c + 1 < w->heap_n && pair_before(&w->heap[c + 1], &w->heap[c])) c++;
    if (!pair_before(&w->heap[c], &last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (w->heap_n) w->heap[i] = last;
  return top;
}

// Looks up the pair of the symbol at pos and the one after it: 1 with *p
// filled when it has a merge, else 0.
static int find_pair(const GPT2Bpe *bpe, const Work *w, size_t pos, Pair *p) {
  if (pos == END || w->next[pos] == END) return 0;
  const MergeSlot *m = merge_find(bpe, w->id[pos], w->id[w->next[pos]]);
  if (!m) return 0;
  *p = (Pair){.rank = m->rank, .left = w->id[pos], .right = w->id[w->next[pos]],
              .merged = m->merged, .pos = pos};
  return 1;
}

// The heap may hold pairs a merge has since undone (lazy deletion): a pair
// still stands when both its symbols are there with the same ids. A
// symbol's id only ever grows longer, and its next symbol changes only by
// merging into it, so equal ids mean the very same two symbols.
static int pair_stands(const Work *w, const Pair *p) {
  size_t r = w->next[p->pos];
  return w->id[p->pos] == p->left && r != END && w->id[r] == p->right;
}

// BPE over one pre-token s[0..n), its ids appended to out. As encoder.py:
// while any adjacent pair has a merge, take the lowest rank and merge each
// of its occurrences, left to right (so "aaa" gives "aa" "a"). Here the
// heap gives the pairs by (rank, position), and the pairs a merge forms go
// to `found` until the rank changes: a pair formed now with a rank below
// the current one must wait for the current rank's merges to end, as it
// does in encoder.py's loop. (merges.txt files learned by BPE never make
// one: a pair that holds a merged token comes after that token's merge.)
static int bpe_word(const GPT2Bpe *bpe, const unsigned char *s, size_t n, Work *w, Ids *out) {
  if (n == 1) return ids_push(out, bpe->byte_id[s[0]]);
  if (work_reserve(w, n)) return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    w->id[i] = bpe->byte_id[s[i]];
    w->next[i] = i + 1 < n ? i + 1 : END;
    w->prev[i] = i > 0 ? i - 1 : END;
  }
  w->heap_n = w->found_n = 0;
  Pair p;
  for (size_t i = 0; i + 1 < n; i++)
    if (find_pair(bpe, w, i, &p)) heap_push(w, p);
  uint32_t rank = NO_ID;
  for (;;) {
    if (w->heap_n == 0 || w->heap[0].rank != rank) {
      for (size_t i = 0; i < w->found_n; i++) heap_push(w, w->found[i]);
      w->found_n = 0;
    }
    if (w->heap_n == 0) break;
    p = heap_pop(w);
    if (!pair_stands(w, &p)) continue;
    rank = p.rank;
    size_t at = p.pos, gone = w->next[at];
    w->id[at] = p.merged;
    w->id[gone] = NO_ID;
    w->next[at] = w->next[gone];
    if (w->next[at] != END) w->prev[w->next[at]] = at;
    if (find_pair(bpe, w, w->prev[at], &w->found[w->found_n])) w->found_n++;
    if (find_pair(bpe, w, at, &w->found[w->found_n])) w->found_n++;
  }
  for (size_t i = 0; i != END; i = w->next[i])
    if (ids_push(out, w->id[i])) return -ENOMEM;
  return 0;
}

int gpt2_bpe_encode(const GPT2Bpe *bpe, const char *text, size_t len, uint32_t **ids,
                    size_t *n) {
  Ids out = {0};
  Work w = {0};
  int rc = 0;
  for (size_t at = 0; at < len && rc == 0;) {
    size_t end = gpt2_bpe_pretoken(text, len, at);
    rc = bpe_word(bpe, (const unsigned char *)text + at, end - at, &w, &out);
    at = end;
  }
  work_free(&w);
  if (rc) {
    free(out.ids);
    out = (Ids){0};
  }
  *ids = out.ids;
  *n = out.n;
  return rc;
}

// ----------------------------------------------------------------------------
// decoding

int gpt2_bpe_decode(const GPT2Bpe *bpe, const uint32_t *ids, size_t n, char **text,
                    size_t *len) {
  *text = NULL;
  *len = 0;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= bpe->n_vocab) return -EINVAL;
    total += bpe->tok_len[ids[i]];
  }
  char *buf = malloc(total + 1);
  if (!buf) return -ENOMEM;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(buf + o, bpe->bytes + bpe->tok_off[ids[i]], bpe->tok_len[ids[i]]);
    o += bpe->tok_len[ids[i]];
  }
  buf[o] = '\0';
  *text = buf;
  *len = o;
  return 0;
}
