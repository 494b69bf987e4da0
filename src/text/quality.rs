//! [`QualityFilter`]: document statistics and Gopher-style rules for pretraining corpora.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{Error, Result};
use crate::text::tensor::xxh3;

/// The statistics one document is judged on. Definitions (the Python reference in the tests
/// follows them word for word):
///
/// - *chars*: Unicode scalar values; *words*: whitespace-separated tokens (`str.split()`);
/// - *lines*: the `\n`-separated lines that are not blank;
/// - `mean_word_len`: chars of all words / words;
/// - `symbol_word_ratio`: (`#` count + `...` count + `…` count) / words;
/// - `digit_frac`: ASCII digits / chars; `alpha_word_frac`: words holding an alphabetic char / words;
/// - `entropy`: Shannon entropy of the char distribution, in bits;
/// - `dup_line_frac`: lines equal to an earlier line / lines; `dup_line_char_frac`: chars of
///   those lines / chars;
/// - `bullet_line_frac`: lines whose first non-space char is one of `•‣◦-*` / lines;
///   `ellipsis_line_frac`: lines ending (before trailing spaces) in `...` or `…` / lines;
/// - `top_ngram_frac[n - 2]`, n = 2..=4: over lowercased words, the most frequent word n-gram
///   (ties: the one with more chars), its count × its chars (chars of its words) / chars of all
///   words; 0 when no n-gram repeats;
/// - `dup_ngram_frac[n - 5]`, n = 5..=10: chars of the words covered by any n-gram that occurs
///   more than once / chars of all words;
/// - `stop_words`: words (lowercased) among `the be to of and that have with`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QualityStats {
    /// Chars.
    pub chars: usize,
    /// Words.
    pub words: usize,
    /// Non-blank lines.
    pub lines: usize,
    /// Mean word length in chars.
    pub mean_word_len: f64,
    /// Symbols per word.
    pub symbol_word_ratio: f64,
    /// Fraction of chars that are ASCII digits.
    pub digit_frac: f64,
    /// Fraction of words with an alphabetic char.
    pub alpha_word_frac: f64,
    /// Char entropy in bits.
    pub entropy: f64,
    /// Fraction of lines that repeat an earlier line.
    pub dup_line_frac: f64,
    /// Fraction of chars in repeated lines.
    pub dup_line_char_frac: f64,
    /// Fraction of lines that are bullets.
    pub bullet_line_frac: f64,
    /// Fraction of lines ending in an ellipsis.
    pub ellipsis_line_frac: f64,
    /// Most frequent 2-, 3-, 4-gram's share of word chars.
    pub top_ngram_frac: [f64; 3],
    /// Share of word chars in repeated 5- to 10-grams.
    pub dup_ngram_frac: [f64; 6],
    /// Stop words.
    pub stop_words: usize,
}

/// Thresholds; `None` turns a rule off. A document is kept when every rule that is on holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QualityRules {
    /// At least this many chars.
    pub min_chars: Option<usize>,
    /// At most this many chars.
    pub max_chars: Option<usize>,
    /// At least this many words.
    pub min_words: Option<usize>,
    /// At most this many words.
    pub max_words: Option<usize>,
    /// Mean word length at least.
    pub min_mean_word_len: Option<f64>,
    /// Mean word length at most.
    pub max_mean_word_len: Option<f64>,
    /// Symbols per word at most.
    pub max_symbol_word_ratio: Option<f64>,
    /// Digit fraction at most.
    pub max_digit_frac: Option<f64>,
    /// Alphabetic-word fraction at least.
    pub min_alpha_word_frac: Option<f64>,
    /// Char entropy at least (bits).
    pub min_entropy: Option<f64>,
    /// Repeated-line fraction at most.
    pub max_dup_line_frac: Option<f64>,
    /// Repeated-line char fraction at most.
    pub max_dup_line_char_frac: Option<f64>,
    /// Bullet-line fraction at most.
    pub max_bullet_line_frac: Option<f64>,
    /// Ellipsis-line fraction at most.
    pub max_ellipsis_line_frac: Option<f64>,
    /// Top 2-, 3-, 4-gram char share at most.
    pub max_top_ngram_frac: [Option<f64>; 3],
    /// Repeated 5..10-gram char share at most.
    pub max_dup_ngram_frac: [Option<f64>; 6],
    /// At least this many stop words.
    pub min_stop_words: Option<usize>,
}

impl QualityRules {
    /// The Gopher rules (Rae et al. 2021, appendix A): 50..=100,000 words, mean word length
    /// 3..=10, symbol/word at most 0.1, bullet lines at most 0.9, ellipsis lines at most 0.3,
    /// alphabetic words at least 0.8, at least 2 stop words, repeated lines at most 0.3 (their
    /// chars at most 0.2), top 2/3/4-gram at most 0.20/0.18/0.16, repeated 5..10-grams at most
    /// 0.15/0.14/0.13/0.12/0.11/0.10.
    pub fn gopher() -> QualityRules {
        QualityRules {
            min_words: Some(50),
            max_words: Some(100_000),
            min_mean_word_len: Some(3.0),
            max_mean_word_len: Some(10.0),
            max_symbol_word_ratio: Some(0.1),
            max_bullet_line_frac: Some(0.9),
            max_ellipsis_line_frac: Some(0.3),
            min_alpha_word_frac: Some(0.8),
            min_stop_words: Some(2),
            max_dup_line_frac: Some(0.3),
            max_dup_line_char_frac: Some(0.2),
            max_top_ngram_frac: [Some(0.20), Some(0.18), Some(0.16)],
            max_dup_ngram_frac: [Some(0.15), Some(0.14), Some(0.13), Some(0.12), Some(0.11), Some(0.10)],
            ..QualityRules::default()
        }
    }

    /// A preset by name: `gopher` or `none` (every rule off).
    pub fn preset(name: &str) -> Result<QualityRules> {
        match name {
            "gopher" => Ok(QualityRules::gopher()),
            "none" => Ok(QualityRules::default()),
            other => Err(Error::invalid("preset", format!("unknown quality preset '{other}' (gopher, none)"))),
        }
    }

    /// Set one threshold by its field name (`min_words`, `max_top_ngram_frac_3`,
    /// `max_dup_ngram_frac_7`, ...); `None` turns the rule off.
    pub fn set(&mut self, name: &str, value: Option<f64>) -> Result<()> {
        let count = |v: Option<f64>| -> Result<Option<usize>> {
            match v {
                None => Ok(None),
                Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= 1e15 => Ok(Some(x as usize)),
                Some(x) => Err(Error::invalid("quality rule", format!("{name} must be a whole number >= 0, not {x}"))),
            }
        };
        let frac = |v: Option<f64>| -> Result<Option<f64>> {
            match v {
                Some(x) if !x.is_finite() => Err(Error::invalid("quality rule", format!("{name} must be finite, not {x}"))),
                v => Ok(v),
            }
        };
        if let Some(n) = name.strip_prefix("max_top_ngram_frac_") {
            let n: usize = n.parse().ok().filter(|n| (2..=4).contains(n)).ok_or_else(|| Error::invalid("quality rule", format!("'{name}': top n-gram rules take n = 2, 3 or 4")))?;
            self.max_top_ngram_frac[n - 2] = frac(value)?;
            return Ok(());
        }
        if let Some(n) = name.strip_prefix("max_dup_ngram_frac_") {
            let n: usize = n.parse().ok().filter(|n| (5..=10).contains(n)).ok_or_else(|| Error::invalid("quality rule", format!("'{name}': repeated n-gram rules take n = 5..10")))?;
            self.max_dup_ngram_frac[n - 5] = frac(value)?;
            return Ok(());
        }
        match name {
            "min_chars" => self.min_chars = count(value)?,
            "max_chars" => self.max_chars = count(value)?,
            "min_words" => self.min_words = count(value)?,
            "max_words" => self.max_words = count(value)?,
            "min_stop_words" => self.min_stop_words = count(value)?,
            "min_mean_word_len" => self.min_mean_word_len = frac(value)?,
            "max_mean_word_len" => self.max_mean_word_len = frac(value)?,
            "max_symbol_word_ratio" => self.max_symbol_word_ratio = frac(value)?,
            "max_digit_frac" => self.max_digit_frac = frac(value)?,
            "min_alpha_word_frac" => self.min_alpha_word_frac = frac(value)?,
            "min_entropy" => self.min_entropy = frac(value)?,
            "max_dup_line_frac" => self.max_dup_line_frac = frac(value)?,
            "max_dup_line_char_frac" => self.max_dup_line_char_frac = frac(value)?,
            "max_bullet_line_frac" => self.max_bullet_line_frac = frac(value)?,
            "max_ellipsis_line_frac" => self.max_ellipsis_line_frac = frac(value)?,
            other => return Err(Error::invalid("quality rule", format!("unknown rule '{other}'"))),
        }
        Ok(())
    }
}

/// Keeps documents that pass every rule of its [`QualityRules`].
#[derive(Clone, Debug, PartialEq)]
pub struct QualityFilter {
    /// The thresholds.
    pub rules: QualityRules,
}

impl Default for QualityFilter {
    /// The Gopher preset.
    fn default() -> QualityFilter {
        QualityFilter { rules: QualityRules::gopher() }
    }
}

/// Hash of an already-hashed key: the identity.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

const STOP_WORDS: [&str; 8] = ["the", "be", "to", "of", "and", "that", "have", "with"];

/// A word's lowercase hash and char count.
fn word_key(w: &str) -> (u64, usize) {
    if w.is_ascii() {
        let mut buf = [0u8; 64];
        if w.len() <= buf.len() {
            for (d, s) in buf.iter_mut().zip(w.bytes()) {
                *d = s.to_ascii_lowercase();
            }
            return (xxh3(&buf[..w.len()], 0), w.len());
        }
        return (xxh3(w.to_ascii_lowercase().as_bytes(), 0), w.len());
    }
    (xxh3(w.to_lowercase().as_bytes(), 0), w.chars().count())
}

fn ngram_hash(keys: &[(u64, usize)]) -> u64 {
    let mut h = 0x9E37_79B9_7F4A_7C15u64;
    for &(k, _) in keys {
        h = (h ^ k).wrapping_mul(0x100_0000_01B3).rotate_left(29);
    }
    h
}

/// Whitespace-separated words (`split_whitespace().count()`, with an ASCII fast path).
fn word_count(text: &str) -> usize {
    if !text.is_ascii() {
        return text.split_whitespace().count();
    }
    let mut n = 0;
    let mut in_word = false;
    for &b in text.as_bytes() {
        // Rust's (and Python's) ASCII whitespace here: space, \t, \n, \x0b, \x0c, \r.
        let ws = matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
        n += (!ws && !in_word) as usize;
        in_word = !ws;
    }
    n
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn is_bullet(line: &str) -> bool {
    matches!(line.trim_start().chars().next(), Some('•' | '‣' | '◦' | '-' | '*'))
}

fn is_ellipsis(line: &str) -> bool {
    let t = line.trim_end();
    t.ends_with("...") || t.ends_with('…')
}

/// The most frequent n-gram's char share (ties: more chars).
fn top_ngram(keys: &[(u64, usize)], n: usize, word_chars: usize) -> f64 {
    if keys.len() < n || word_chars == 0 {
        return 0.0;
    }
    let mut counts: IdMap<(u32, usize)> = IdMap::default();
    for g in keys.windows(n) {
        let e = counts.entry(ngram_hash(g)).or_insert((0, g.iter().map(|k| k.1).sum()));
        e.0 += 1;
    }
    let best = counts.values().filter(|(c, _)| *c > 1).max_by_key(|(c, chars)| (*c, *chars));
    best.map_or(0.0, |&(c, chars)| ratio(c as usize * chars, word_chars))
}

/// Char share of words covered by a repeated n-gram.
fn dup_ngram(keys: &[(u64, usize)], n: usize, word_chars: usize) -> f64 {
    if keys.len() < n || word_chars == 0 {
        return 0.0;
    }
    let hashes: Vec<u64> = keys.windows(n).map(ngram_hash).collect();
    let mut counts: IdMap<u32> = IdMap::default();
    for &h in &hashes {
        *counts.entry(h).or_insert(0) += 1;
    }
    let mut covered = vec![false; keys.len()];
    for (i, h) in hashes.iter().enumerate() {
        if counts[h] > 1 {
            covered[i..i + n].iter_mut().for_each(|c| *c = true);
        }
    }
    let chars: usize = keys.iter().zip(&covered).filter(|(_, &c)| c).map(|(k, _)| k.1).sum();
    ratio(chars, word_chars)
}

impl QualityFilter {
    /// A filter with these rules.
    pub fn new(rules: QualityRules) -> QualityFilter {
        QualityFilter { rules }
    }

    /// Every statistic of `text`.
    pub fn stats(text: &str) -> QualityStats {
        let mut s = QualityStats { chars: text.chars().count(), ..QualityStats::default() };
        s.digit_frac = ratio(text.bytes().filter(|b| b.is_ascii_digit()).count(), s.chars);
        s.entropy = char_entropy(text, s.chars);
        let words: Vec<&str> = text.split_whitespace().collect();
        s.words = words.len();
        let keys: Vec<(u64, usize)> = words.iter().map(|w| word_key(w)).collect();
        let word_chars: usize = keys.iter().map(|k| k.1).sum();
        s.mean_word_len = ratio(word_chars, s.words);
        s.symbol_word_ratio = ratio(symbol_count(text), s.words);
        s.alpha_word_frac = ratio(words.iter().filter(|w| w.chars().any(char::is_alphabetic)).count(), s.words);
        let stop: HashSet<u64> = STOP_WORDS.iter().map(|w| xxh3(w.as_bytes(), 0)).collect();
        s.stop_words = keys.iter().filter(|k| stop.contains(&k.0)).count();
        let (lines, dup, dup_chars, bullets, ellipses) = line_stats(text);
        s.lines = lines;
        s.dup_line_frac = ratio(dup, lines);
        s.dup_line_char_frac = ratio(dup_chars, s.chars);
        s.bullet_line_frac = ratio(bullets, lines);
        s.ellipsis_line_frac = ratio(ellipses, lines);
        for n in 2..=4 {
            s.top_ngram_frac[n - 2] = top_ngram(&keys, n, word_chars);
        }
        for n in 5..=10 {
            s.dup_ngram_frac[n - 5] = dup_ngram(&keys, n, word_chars);
        }
        s
    }

    /// True when `text` passes every rule; cheap rules first, and stops at the first failure.
    pub fn keep(&self, text: &str) -> bool {
        let r = &self.rules;
        let chars = if r.min_chars.is_some() || r.max_chars.is_some() || r.max_digit_frac.is_some() || r.min_entropy.is_some() || r.max_dup_line_char_frac.is_some() {
            text.chars().count()
        } else {
            0
        };
        if r.min_chars.is_some_and(|m| chars < m) || r.max_chars.is_some_and(|m| chars > m) {
            return false;
        }
        let need_keys = r.min_mean_word_len.is_some() || r.max_mean_word_len.is_some() || r.min_stop_words.is_some() || r.max_top_ngram_frac.iter().chain(&r.max_dup_ngram_frac).any(Option::is_some);
        let words: Vec<&str> = if need_keys || r.min_alpha_word_frac.is_some() { text.split_whitespace().collect() } else { Vec::new() };
        let n = if words.is_empty() { word_count(text) } else { words.len() };
        if r.min_words.is_some_and(|m| n < m) || r.max_words.is_some_and(|m| n > m) {
            return false;
        }
        let keys: Vec<(u64, usize)> = if need_keys { words.iter().map(|w| word_key(w)).collect() } else { Vec::new() };
        let word_chars: usize = keys.iter().map(|k| k.1).sum();
        let mean = ratio(word_chars, n);
        if r.min_mean_word_len.is_some_and(|m| mean < m) || r.max_mean_word_len.is_some_and(|m| mean > m) {
            return false;
        }
        if r.max_symbol_word_ratio.is_some_and(|m| ratio(symbol_count(text), n) > m) {
            return false;
        }
        if r.max_digit_frac.is_some_and(|m| ratio(text.bytes().filter(|b| b.is_ascii_digit()).count(), chars) > m) {
            return false;
        }
        if r.min_alpha_word_frac.is_some_and(|m| ratio(words.iter().filter(|w| w.chars().any(char::is_alphabetic)).count(), n) < m) {
            return false;
        }
        if let Some(m) = r.min_stop_words {
            let stop: [u64; 8] = STOP_WORDS.map(|w| xxh3(w.as_bytes(), 0));
            if keys.iter().filter(|k| stop.contains(&k.0)).take(m).count() < m {
                return false;
            }
        }
        if r.min_entropy.is_some_and(|m| char_entropy(text, chars) < m) {
            return false;
        }
        if r.max_dup_line_frac.is_some() || r.max_dup_line_char_frac.is_some() || r.max_bullet_line_frac.is_some() || r.max_ellipsis_line_frac.is_some() {
            let (lines, dup, dup_chars, bullets, ellipses) = line_stats(text);
            if r.max_dup_line_frac.is_some_and(|m| ratio(dup, lines) > m)
                || r.max_dup_line_char_frac.is_some_and(|m| ratio(dup_chars, chars) > m)
                || r.max_bullet_line_frac.is_some_and(|m| ratio(bullets, lines) > m)
                || r.max_ellipsis_line_frac.is_some_and(|m| ratio(ellipses, lines) > m)
            {
                return false;
            }
        }
        for n in 2..=4 {
            if r.max_top_ngram_frac[n - 2].is_some_and(|m| top_ngram(&keys, n, word_chars) > m) {
                return false;
            }
        }
        for n in 5..=10 {
            if r.max_dup_ngram_frac[n - 5].is_some_and(|m| dup_ngram(&keys, n, word_chars) > m) {
                return false;
            }
        }
        true
    }
}

/// `#` + `...` (non-overlapping) + `…` occurrences, in one pass.
fn symbol_count(text: &str) -> usize {
    let b = text.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'#' => {
                n += 1;
                i += 1;
            }
            b'.' if b.get(i + 1) == Some(&b'.') && b.get(i + 2) == Some(&b'.') => {
                n += 1;
                i += 3;
            }
            0xE2 if b.get(i + 1) == Some(&0x80) && b.get(i + 2) == Some(&0xA6) => {
                n += 1;
                i += 3;
            }
            _ => i += 1,
        }
    }
    n
}

/// Shannon entropy (bits) of the chars of `text` (`chars` of them).
fn char_entropy(text: &str, chars: usize) -> f64 {
    let mut ascii = [0usize; 128];
    let mut other: HashMap<char, usize> = HashMap::new();
    if text.is_ascii() {
        for &b in text.as_bytes() {
            ascii[b as usize] += 1;
        }
    } else {
        for c in text.chars() {
            if c.is_ascii() {
                ascii[c as usize] += 1;
            } else {
                *other.entry(c).or_insert(0) += 1;
            }
        }
    }
    entropy(ascii.iter().copied().filter(|&c| c > 0).chain(other.into_values()), chars)
}

fn entropy(counts: impl Iterator<Item = usize>, total: usize) -> f64 {
    if total == 0 {
        return 0.0;
    }
    let t = total as f64;
    -counts.map(|c| c as f64 / t).map(|p| p * p.log2()).sum::<f64>()
}

/// (non-blank lines, lines repeating an earlier one, chars of those, bullet lines, ellipsis lines).
fn line_stats(text: &str) -> (usize, usize, usize, usize, usize) {
    let mut seen: HashSet<&str> = HashSet::new();
    let (mut lines, mut dup, mut dup_chars, mut bullets, mut ellipses) = (0, 0, 0, 0, 0);
    for line in text.split('\n').filter(|l| !l.trim().is_empty()) {
        lines += 1;
        if !seen.insert(line) {
            dup += 1;
            dup_chars += line.chars().count();
        }
        bullets += is_bullet(line) as usize;
        ellipses += is_ellipsis(line) as usize;
    }
    (lines, dup, dup_chars, bullets, ellipses)
}
