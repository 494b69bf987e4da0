//! [`PiiMasker`]: personal data found by pattern *and* validated before it is masked.

use std::net::Ipv6Addr;
use std::ops::Range;
use std::str::FromStr;

use regex::{Regex, RegexSet};

use crate::error::{Error, Result};

/// What a masked span was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PiiKind {
    /// Provider API keys and tokens (Stripe, OpenAI, Anthropic, GitHub, GitLab, Slack, AWS,
    /// Google, Hugging Face, npm).
    ApiKey,
    /// E-mail addresses (a dotted domain with an alphabetic TLD).
    Email,
    /// Payment card numbers: 13-19 digits with a known issuer prefix and a valid Luhn checksum.
    CreditCard,
    /// US social security numbers `AAA-GG-SSSS` (not area 000 / 666 / 9xx, group 00, serial 0000).
    Ssn,
    /// IPv6 addresses that parse as such.
    Ipv6,
    /// IPv4 addresses (octets <= 255, no leading zeros), not version strings.
    Ipv4,
    /// Phone numbers written as phone numbers: `+` country code, or NANP `(AAA) EEE-NNNN` /
    /// `AAA-EEE-NNNN` with valid area and exchange codes.
    Phone,
    /// International bank account numbers (ISO 13616): a registered country code, that
    /// country's length, and the mod-97 check; compact or in groups of four separated by spaces.
    Iban,
}

impl PiiKind {
    /// Every kind, in masking priority order.
    pub const ALL: [PiiKind; KINDS] = [PiiKind::ApiKey, PiiKind::Email, PiiKind::Iban, PiiKind::CreditCard, PiiKind::Ssn, PiiKind::Ipv6, PiiKind::Ipv4, PiiKind::Phone];

    /// `api_key`, `email`, `iban`, `credit_card`, `ssn`, `ipv6`, `ipv4`, `phone`.
    pub fn name(self) -> &'static str {
        match self {
            PiiKind::ApiKey => "api_key",
            PiiKind::Email => "email",
            PiiKind::CreditCard => "credit_card",
            PiiKind::Ssn => "ssn",
            PiiKind::Ipv6 => "ipv6",
            PiiKind::Ipv4 => "ipv4",
            PiiKind::Phone => "phone",
            PiiKind::Iban => "iban",
        }
    }

    /// Parse a kind name (`ip` means both address kinds' placeholder is set by the caller).
    pub fn parse(name: &str) -> Result<PiiKind> {
        PiiKind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| Error::invalid("pii kind", format!("unknown kind '{name}' (api_key, email, iban, credit_card, ssn, ipv6, ipv4, phone)")))
    }

    /// The default placeholder.
    pub fn placeholder(self) -> &'static str {
        match self {
            PiiKind::ApiKey => "<API_KEY>",
            PiiKind::Email => "<EMAIL>",
            PiiKind::CreditCard => "<CREDIT_CARD>",
            PiiKind::Ssn => "<SSN>",
            PiiKind::Ipv6 | PiiKind::Ipv4 => "<IP_ADDRESS>",
            PiiKind::Phone => "<PHONE>",
            PiiKind::Iban => "<IBAN>",
        }
    }
}

/// How many kinds there are.
const KINDS: usize = 8;

/// One pattern per kind, in the order of [`PiiKind::ALL`].
const PATTERNS: [(PiiKind, &str); KINDS] = [
    (
        PiiKind::ApiKey,
        r"(?-u)\b(?:(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}|sk-(?:proj-|ant-(?:api[0-9][0-9]-)?)?[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255}|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}|glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36})",
    ),
    (PiiKind::Email, r"(?i-u)\b[a-z0-9][a-z0-9._%+-]{0,63}@[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.[a-z]{2,24}\b"),
    (PiiKind::Iban, r"(?-u)\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"),
    (PiiKind::CreditCard, r"(?-u)\b[0-9](?:[ -]?[0-9]){12,18}\b"),
    (PiiKind::Ssn, r"(?-u)\b[0-9]{3}-[0-9]{2}-[0-9]{4}\b"),
    (PiiKind::Ipv6, r"(?i-u)[0-9a-f:]*:[0-9a-f]*:[0-9a-f:.]*"),
    (PiiKind::Ipv4, r"(?-u)\b[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\b"),
    (PiiKind::Phone, r"(?-u)\+[0-9]{1,3}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}|(?:\b1[ .-]?)?(?:\([0-9]{3}\)[ .-]?|\b[0-9]{3}[ .-])[0-9]{3}[ .-][0-9]{4}\b"),
];

/// Words that make a following dotted quad a version number, not an address.
const VERSION_WORDS: [&str; 12] = ["version", "ver", "v", "release", "build", "rev", "revision", "firmware", "kernel", "python", "release:", "tag"];

/// Finds personal data, validates each candidate, and replaces it with a placeholder.
///
/// Validation, not bare patterns: card numbers need an issuer prefix and the Luhn checksum,
/// SSNs the issuable ranges, IPv4 octets <= 255 without leading zeros and not a version string
/// (`v1.2.3.4`, `version 1.2.3.4`, or four parts of a longer dotted number), IPv6 a full
/// parse, phones a country code or valid NANP area / exchange codes, API keys a digit in the
/// token. Overlapping candidates: the leftmost wins, then the longest.
#[derive(Clone, Debug)]
pub struct PiiMasker {
    set: RegexSet,
    regexes: Vec<(PiiKind, Regex)>,
    placeholders: [String; KINDS],
    enabled: [bool; KINDS],
}

impl Default for PiiMasker {
    fn default() -> PiiMasker {
        PiiMasker::new(&PiiKind::ALL, &[]).unwrap_or_else(|e| unreachable!("built-in patterns compile: {e}"))
    }
}

fn index(kind: PiiKind) -> usize {
    PiiKind::ALL.iter().position(|&k| k == kind).unwrap_or(0)
}

impl PiiMasker {
    /// A masker for `kinds` with placeholders overriding the defaults.
    pub fn new(kinds: &[PiiKind], placeholders: &[(PiiKind, String)]) -> Result<PiiMasker> {
        let set = RegexSet::new(PATTERNS.iter().map(|p| p.1)).map_err(|e| Error::invalid("pii pattern", e.to_string()))?;
        let regexes = PATTERNS.iter().map(|&(k, p)| Regex::new(p).map(|r| (k, r)).map_err(|e| Error::invalid("pii pattern", e.to_string()))).collect::<Result<Vec<_>>>()?;
        let mut ph: [String; KINDS] = PiiKind::ALL.map(|k| k.placeholder().to_string());
        for (k, p) in placeholders {
            ph[index(*k)] = p.clone();
        }
        let mut enabled = [false; KINDS];
        for k in kinds {
            enabled[index(*k)] = true;
        }
        Ok(PiiMasker { set, regexes, placeholders: ph, enabled })
    }

    /// The validated spans (byte ranges) of personal data in `text`, in order, not overlapping.
    pub fn find(&self, text: &str) -> Vec<(PiiKind, Range<usize>)> {
        // Every kind needs a digit or an `@`, except AWS key ids (which may be all letters):
        // most text is rejected by one byte scan. The prefilter only skips work; it never
        // decides what is masked.
        if !text.bytes().any(|b| b.is_ascii_digit() || b == b'@') && !(self.enabled[index(PiiKind::ApiKey)] && (text.contains("AKIA") || text.contains("ASIA"))) {
            return Vec::new();
        }
        let hits = self.set.matches(text);
        let mut spans = Vec::new();
        for (i, (kind, re)) in self.regexes.iter().enumerate() {
            if !self.enabled[i] || !hits.matched(i) {
                continue;
            }
            for m in re.find_iter(text) {
                if let Some(r) = validate(*kind, text, m.range()) {
                    spans.push((*kind, r));
                }
            }
        }
        spans.sort_by_key(|(k, r)| (r.start, std::cmp::Reverse(r.end), *k));
        let mut out: Vec<(PiiKind, Range<usize>)> = Vec::with_capacity(spans.len());
        for (k, r) in spans {
            if out.last().is_none_or(|(_, last)| r.start >= last.end) {
                out.push((k, r));
            }
        }
        out
    }

    /// Mask `text` into `out` (cleared first); false when nothing was found.
    pub fn mask_into(&self, text: &str, out: &mut String) -> bool {
        out.clear();
        let spans = self.find(text);
        if spans.is_empty() {
            return false;
        }
        let mut at = 0;
        for (k, r) in spans {
            out.push_str(&text[at..r.start]);
            out.push_str(&self.placeholders[index(k)]);
            at = r.end;
        }
        out.push_str(&text[at..]);
        true
    }

    /// Mask one string.
    pub fn mask(&self, text: &str) -> String {
        let mut out = String::new();
        if self.mask_into(text, &mut out) {
            out
        } else {
            text.to_string()
        }
    }
}

/// The span to mask for a candidate, or `None` when validation rejects it.
fn validate(kind: PiiKind, text: &str, r: Range<usize>) -> Option<Range<usize>> {
    // Patterns use ASCII word boundaries (so the DFA engines run on any text); a match that
    // touches a non-ASCII letter or digit is part of a longer word.
    let before = text[..r.start].chars().next_back();
    let after = text[r.end..].chars().next();
    if before.is_some_and(|c| !c.is_ascii() && c.is_alphanumeric()) || after.is_some_and(|c| !c.is_ascii() && c.is_alphanumeric()) {
        return None;
    }
    let s = &text[r.clone()];
    match kind {
        PiiKind::ApiKey => (s.bytes().any(|b| b.is_ascii_digit()) || s.starts_with("AKIA") || s.starts_with("ASIA")).then_some(r),
        PiiKind::Email => {
            let (local, domain) = s.split_once('@')?;
            let ok = !local.starts_with('.') && !local.ends_with('.') && !local.contains("..") && s.len() <= 254 && domain.contains('.');
            ok.then_some(r)
        }
        PiiKind::CreditCard => {
            let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect();
            // Separators must be regular: none, or one kind only.
            let seps: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_digit()).collect();
            let regular = seps.windows(2).all(|w| w[0] == w[1]);
            (regular && (13..=19).contains(&digits.len()) && issuer_prefix(&digits) && luhn(&digits)).then_some(r)
        }
        PiiKind::Ssn => {
            let d: Vec<u32> = s.split('-').map(|p| p.parse().unwrap_or(0)).collect();
            let (area, group, serial) = (d[0], d[1], d[2]);
            (area != 0 && area != 666 && area < 900 && group != 0 && serial != 0).then_some(r)
        }
        PiiKind::Ipv4 => {
            let before = text[..r.start].chars().next_back();
            let after = text[r.end..].chars().next();
            let after2 = text[r.end..].chars().nth(1);
            // Part of a longer dotted number (1.2.3.4.5) or of a word.
            if before == Some('.') || (after == Some('.') && after2.is_some_and(|c| c.is_ascii_digit())) || before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                return None;
            }
            let octets_ok = s.split('.').all(|o| o.len() == 1 || (!o.starts_with('0') && o.parse::<u32>().is_ok_and(|v| v <= 255)));
            if !octets_ok {
                return None;
            }
            let head = text[..r.start].trim_end_matches([' ', ':', '=', '\t']);
            let word = head.rsplit(|c: char| !c.is_alphanumeric()).next().unwrap_or("").to_ascii_lowercase();
            (!VERSION_WORDS.contains(&word.as_str())).then_some(r)
        }
        PiiKind::Ipv6 => {
            let before = text[..r.start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                return None;
            }
            // A sentence may end in `:` or `.` right after an address.
            let mut cand = r.clone();
            for _ in 0..2 {
                let t = &text[cand.clone()];
                let after = text[cand.end..].chars().next();
                if t.matches(':').count() >= 2 && Ipv6Addr::from_str(t).is_ok() && !after.is_some_and(|c| c.is_alphanumeric() || c == '_') && t.bytes().any(|b| b.is_ascii_hexdigit()) {
                    // Short compressed forms (`::1`, `fe80::1`: fewer than three groups) read
                    // as addresses only standing alone in prose; in code (`a[::2]`,
                    // `x[1::3]`, `x[:, ::2]`) they are slices.
                    let groups = t.split([':', '.']).filter(|g| !g.is_empty()).count();
                    let alone = |c: Option<char>, ok: &[char]| c.is_none_or(|c| c.is_whitespace() || ok.contains(&c));
                    if groups >= 3 || (alone(before, &['(', '"', '\'']) && alone(after, &['.', ',', ';', ')', '"', '\'', '!', '?'])) {
                        return Some(cand);
                    }
                    return None;
                }
                if t.ends_with(':') || t.ends_with('.') {
                    cand.end -= 1;
                } else {
                    break;
                }
            }
            None
        }
        PiiKind::Iban => iban(s).map(|len| r.start..r.start + len),
        PiiKind::Phone => {
            let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect();
            if s.starts_with('+') {
                return (8..=15).contains(&digits.len()).then_some(r);
            }
            // NANP: optional leading 1, then area and exchange codes starting 2-9.
            let d = if digits.len() == 11 && digits[0] == 1 { &digits[1..] } else { &digits[..] };
            (d.len() == 10 && d[0] >= 2 && d[3] >= 2 && !(d[1] == 1 && d[2] == 1)).then_some(r)
        }
    }
}

/// IBAN lengths by country (the ISO 13616 registry).
const IBAN_LENGTHS: [(&str, usize); 87] = [
    ("AD", 24), ("AE", 23), ("AL", 28), ("AT", 20), ("AZ", 28), ("BA", 20), ("BE", 16), ("BG", 22), ("BH", 22), ("BI", 27),
    ("BR", 29), ("BY", 28), ("CH", 21), ("CR", 22), ("CY", 28), ("CZ", 24), ("DE", 22), ("DJ", 27), ("DK", 18), ("DO", 28),
    ("EE", 20), ("EG", 29), ("ES", 24), ("FI", 18), ("FK", 18), ("FO", 18), ("FR", 27), ("GB", 22), ("GE", 22), ("GI", 23),
    ("GL", 18), ("GR", 27), ("GT", 28), ("HR", 21), ("HU", 28), ("IE", 22), ("IL", 23), ("IQ", 23), ("IS", 26), ("IT", 27),
    ("JO", 30), ("KW", 30), ("KZ", 20), ("LB", 28), ("LC", 32), ("LI", 21), ("LT", 20), ("LU", 20), ("LV", 21), ("LY", 25),
    ("MC", 27), ("MD", 24), ("ME", 22), ("MK", 19), ("MN", 20), ("MR", 27), ("MT", 31), ("MU", 30), ("NI", 28), ("NL", 18),
    ("NO", 15), ("OM", 23), ("PK", 24), ("PL", 28), ("PS", 29), ("PT", 25), ("QA", 29), ("RO", 24), ("RS", 22), ("RU", 33),
    ("SA", 24), ("SC", 31), ("SD", 18), ("SE", 24), ("SI", 19), ("SK", 24), ("SM", 27), ("SO", 23), ("ST", 25), ("SV", 28),
    ("TL", 23), ("TN", 24), ("TR", 26), ("UA", 29), ("VA", 22), ("VG", 24), ("XK", 20),
];

/// The byte length of the IBAN `s` starts with (its country's length of letters and digits,
/// single spaces between groups allowed), when the country is registered, the characters after
/// it do not continue a group, and the mod-97 check holds.
fn iban(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let want = IBAN_LENGTHS.iter().find(|(c, _)| Some(c.as_bytes()) == b.get(..2)).map(|&(_, n)| n)?;
    let mut chars = Vec::with_capacity(want);
    let mut end = 0;
    for (i, &c) in b.iter().enumerate() {
        if chars.len() == want {
            break;
        }
        if c == b' ' {
            continue;
        }
        chars.push(c);
        end = i + 1;
    }
    // The IBAN must end where a group ends: not inside a run of letters and digits.
    if chars.len() != want || b.get(end).is_some_and(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    // Check digits: the first four characters moved to the end, letters as 10..35, mod 97 == 1.
    let mut rem = 0u32;
    for &c in chars[4..].iter().chain(&chars[..4]) {
        rem = match c {
            b'0'..=b'9' => (rem * 10 + (c - b'0') as u32) % 97,
            b'A'..=b'Z' => (rem * 100 + (c - b'A' + 10) as u32) % 97,
            _ => return None,
        };
    }
    (rem == 1).then_some(end)
}

fn issuer_prefix(d: &[u8]) -> bool {
    let p = |n: usize| d[..n].iter().fold(0u32, |a, &x| a * 10 + x as u32);
    match d[0] {
        4 => true,
        5 => (51..=55).contains(&p(2)),
        2 => (2221..=2720).contains(&p(4)),
        3 => matches!(p(2), 34 | 37 | 36 | 38 | 30) || (3528..=3589).contains(&p(4)),
        6 => p(4) == 6011 || p(2) == 65 || (644..=649).contains(&p(3)) || p(2) == 62,
        _ => false,
    }
}

/// The Luhn checksum holds.
pub(crate) fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = d as u32;
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}
