/*
 * examples/gpt2/bpe.h — GPT-2's byte-level BPE tokenizer, read from Hugging
 * Face's vocab.json and merges.txt (docs/tokenizer.md).
 *
 * Encoding does what OpenAI's encoder.py does: the text is cut into
 * pre-tokens by GPT-2's pattern
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * (matched by hand over UTF-8 code points, bpe.c), each pre-token's bytes
 * become one symbol each, and the merges are applied by rank, the lowest
 * first, every occurrence of a pair left to right, until no adjacent pair
 * has one. Decoding concatenates the tokens' bytes. The text is bytes, not
 * necessarily UTF-8: every byte has a token, so decode(encode(x)) == x for
 * any x. "<|endoftext|>" in a text is encoded as its 13 characters, as
 * encoder.py does; gpt2_bpe_token_id gives its id for a caller to append.
 *
 * A GPT2Bpe is read-only once loaded: encode and decode may run from any
 * number of threads at once. Every function here is synchronous.
 */
#ifndef GPT2_BPE_H
#define GPT2_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct GPT2Bpe GPT2Bpe;

// Reads the vocabulary (vocab.json: an object from each token, in GPT-2's
// byte-to-character mapping, to its id; ids 0 to n-1, each once) and the
// merges (merges.txt: an optional "#version" first line, then one merge a
// line, two tokens separated by one space, the line's order its rank).
// Every merge's two tokens and their join must be in the vocabulary, and
// every byte must have a token. Returns 0 with *out set; or a negative
// errno (-ENOENT and the like from opening a file, -EINVAL for a file that
// is not what is expected, -ENOMEM) with *out NULL and, when err is not
// NULL, a sentence in err (errlen bytes) naming the file, the line where
// there is one, and what was expected there.
int gpt2_bpe_load(GPT2Bpe **out, const char *vocab_json, const char *merges_txt, char *err,
                  size_t errlen);

// Frees what gpt2_bpe_load allocated; NULL is fine.
void gpt2_bpe_free(GPT2Bpe *bpe);

// The number of tokens (GPT-2's is 50257): every id is below it.
size_t gpt2_bpe_vocab_size(const GPT2Bpe *bpe);

// The id of the token whose bytes are bytes[0..len) ("<|endoftext|>" is 13
// plain bytes), or -ENOENT when there is none.
int gpt2_bpe_token_id(const GPT2Bpe *bpe, const char *bytes, size_t len);

// Where the pre-token that starts at byte `start` of text[0..len) ends
// (start < len; the result is > start and <= len). Calling it again from
// each end cuts the text exactly as GPT-2's pattern does. Needs no
// vocabulary.
size_t gpt2_bpe_pretoken(const char *text, size_t len, size_t start);

// Encodes text[0..len) (any bytes) into *ids, *n of them, which the caller
// frees with free() (NULL when *n is 0). Returns 0, or -ENOMEM with *ids
// NULL and *n 0.
int gpt2_bpe_encode(const GPT2Bpe *bpe, const char *text, size_t len, uint32_t **ids,
                    size_t *n);

// Decodes ids[0..n) into *text, *len bytes followed by a '\0' that *len does
// not count, which the caller frees with free(). Returns 0; -EINVAL when an
// id is not below the vocabulary's size; -ENOMEM. On failure *text is NULL
// and *len 0.
int gpt2_bpe_decode(const GPT2Bpe *bpe, const uint32_t *ids, size_t n, char **text,
                    size_t *len);

// bpe_unicode.c, for the pre-tokenizer: whether a code point is in \p{L}
// (a letter) or \p{N} (a number) as GPT-2's pattern sees them.
int gpt2_bpe_is_letter(uint32_t cp);
int gpt2_bpe_is_number(uint32_t cp);

#endif /* GPT2_BPE_H */
