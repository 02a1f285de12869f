#!/usr/bin/python3
# Independent GPT-2 BPE encoder (OpenAI's encoder.py algorithm) used as the tests' reference.
#
# Usage: gpt2_reference_encoder.py ENCODER_JSON VOCAB_BPE PATTERN STRINGS_JSON
#   PATTERN: gpt2 | llama3 | qwen2 (the pre-tokenizer regex); STRINGS_JSON: a file with a
#   JSON list of strings. Prints a JSON list with the ids of each string.
#   With ENCODER_JSON = "-" it prints the NFC form of each string instead.
# The `regex` module (\p{L}) is not needed: the pattern is rebuilt for `re` with
# character classes computed here from unicodedata, and \s spelled as White_Space.
import functools
import json
import re
import sys
import unicodedata


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return {(a, b) for a, b in zip(word, word[1:])}


def char_class(pred):
    out, start = [], None
    for cp in range(0x110001):
        if cp < 0x110000 and not (0xD800 <= cp <= 0xDFFF) and pred(chr(cp)):
            if start is None:
                start = cp
        elif start is not None:
            out.append("\\U%08x-\\U%08x" % (start, cp - 1))
            start = None
    return "".join(out)


WHITE_SPACE = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"


def pattern(name):
    L = char_class(lambda c: unicodedata.category(c).startswith("L"))
    N = char_class(lambda c: unicodedata.category(c).startswith("N"))
    S = WHITE_SPACE
    letters, numbers, space = f"[{L}]", f"[{N}]", f"[{S}]"
    other = f"[^{S}{L}{N}]"
    not_space = f"[^{S}]"
    if name == "gpt2":
        p = (rf"'s|'t|'re|'ve|'m|'ll|'d| ?{letters}+| ?{numbers}+| ?{other}+|"
             rf"{space}+(?!{not_space})|{space}+")
    else:
        digits = "{1,3}" if name == "llama3" else ""
        p = (rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?{letters}+|{numbers}{digits}|"
             rf" ?{other}+[\r\n]*|{space}*[\r\n]+|{space}+(?!{not_space})|{space}+")
    return re.compile(p)


class Encoder:
    def __init__(self, encoder, merges, pat):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.pat = pat

    @functools.lru_cache(maxsize=None)
    def bpe(self, token):
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        return " ".join(word)

    def encode(self, text):
        ids = []
        for token in re.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return ids


def main():
    encoder_path, vocab_path, pat_name, strings_path = sys.argv[1:5]
    with open(strings_path, encoding="utf-8") as f:
        strings = json.load(f)
    if encoder_path == "-":
        print(json.dumps([unicodedata.normalize("NFC", s) for s in strings]))
        return
    with open(encoder_path, encoding="utf-8") as f:
        encoder = json.load(f)
    with open(vocab_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = [tuple(line.split()) for line in lines[1:] if line]
    enc = Encoder(encoder, merges, pattern(pat_name))
    print(json.dumps([enc.encode(s) for s in strings]))


if __name__ == "__main__":
    main()
