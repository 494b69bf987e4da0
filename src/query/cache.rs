//! Plan reuse for SQL text: `_id IN (<integer literals>)` lists and the id lists of
//! `gather('t', [<integer literals>])` are lifted out of a query (`_id = ANY($k)`,
//! `gather('t', $k)`), the lifted text is prepared once ([`PreparedQuery`]) and later queries
//! of the same shape execute that plan with their own ids. A point lookup written as SQL text
//! then costs one pass over the text and an execution instead of parsing, analysing,
//! optimising and planning 256 literals each time.
//!
//! Only what is certain to mean the same is lifted: an `_id IN (...)` list of unsigned integer
//! literals (`IN` and `= ANY` select the same rows, in the same id order from a zrecord scan),
//! and the unsigned integer list of a `gather` over a *registered* table (checked at every
//! call: a path names whatever is there now, so `gather('data/root', ...)` and `FROM 'path'`
//! are not cached). A shape whose prepared form does not reuse its physical plan (the `_id` is
//! not a zrecord table's, the list sits in a projection, ...) is remembered as such and runs
//! the usual way. Queries with their own parameters are not cached. Entries hold their
//! tables: call [`PlanCache::clear`] after changing the catalog.
//!
//! The text is read by a small lexer that knows only plain and `"quoted"` words, integers,
//! `'strings'` without backslashes, whitespace and punctuation, and hands anything else
//! (comments, `$`, prefixed strings, non-ASCII outside quotes, ...) to sqlparser's tokenizer:
//! both split the texts they accept the same way (a property test checks it).

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use datafusion::common::ScalarValue;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::query::prepared::{id_list, PreparedQuery};

/// A query with its id lists lifted into parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifted {
    /// The text with each list replaced by `_id = ANY($k)` or `gather('t', $k)`.
    pub text: String,
    /// The ids of each list, in order (`$1`, `$2`, ...).
    pub lists: Vec<Vec<u64>>,
    /// The table each lifted `gather` names (it must be a registered table) and the index of
    /// its list in `lists`.
    pub gathers: Vec<(String, usize)>,
}

/// The tokens the lifting looks at; everything else is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Space,
    /// A word: `quoted` for a double-quoted identifier.
    Word { quoted: bool },
    /// Unsigned integer digits.
    Number,
    /// A single-quoted string; the value is the unescaped content.
    Str,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    /// A placeholder (`$1`, `?`): the query is not lifted.
    Placeholder,
    Other,
}

struct Tok<'a> {
    kind: Kind,
    /// The token as written (copied to the lifted text).
    text: Cow<'a, str>,
    /// The word (unquoted), the digits, or the string's content.
    value: Cow<'a, str>,
}

/// The fast lexer: `None` when the text holds anything beyond plain words, integers, simple
/// strings, whitespace and punctuation that cannot start a longer token.
fn fast_tokens(sql: &str) -> Option<Vec<Tok<'_>>> {
    let b = sql.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 3 + 4);
    let mut i = 0;
    let word_byte = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
                    i += 1;
                }
                Kind::Space
            }
            b'0'..=b'9' => {
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                // `1e5`, `1.5`, `0x1F`, `1_000`: sqlparser's business.
                if i < b.len() && (word_byte(b[i]) || b[i] == b'.') {
                    return None;
                }
                Kind::Number
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && word_byte(b[i]) {
                    i += 1;
                }
                // A prefixed string (`E'..'`, `X'..'`, `N'..'`) or a word glued to `$`, `@`, `#`.
                if i < b.len() && matches!(b[i], b'\'' | b'"' | b'$' | b'@' | b'#') {
                    return None;
                }
                Kind::Word { quoted: false }
            }
            b'"' => {
                // A quoted identifier: `""` is a quote inside it.
                i += 1;
                loop {
                    match b.get(i)? {
                        b'"' if b.get(i + 1) == Some(&b'"') => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
                Kind::Word { quoted: true }
            }
            b'\'' => {
                i += 1;
                loop {
                    match b.get(i)? {
                        b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
                        b'\'' => break,
                        b'\\' => return None,
                        c if !c.is_ascii() => return None,
                        _ => i += 1,
                    }
                }
                i += 1;
                Kind::Str
            }
            b'(' | b')' | b'[' | b']' | b',' => {
                i += 1;
                match c {
                    b'(' => Kind::LParen,
                    b')' => Kind::RParen,
                    b'[' => Kind::LBracket,
                    b']' => Kind::RBracket,
                    _ => Kind::Comma,
                }
            }
            // `--` and `/*` start comments.
            b'-' | b'/' if matches!(b.get(i + 1), Some(b'-' | b'*')) => return None,
            b'.' | b';' | b'*' | b'=' | b'<' | b'>' | b'+' | b'-' | b'/' | b'%' | b'!' | b'|' | b'&' | b'^' | b'~' | b':' => {
                i += 1;
                Kind::Other
            }
            _ => return None,
        };
        let text = &sql[start..i];
        let value = match kind {
            Kind::Str => Cow::Owned(text[1..text.len() - 1].replace("''", "'")),
            Kind::Word { quoted: true } => Cow::Owned(text[1..text.len() - 1].replace("\"\"", "\"")),
            _ => Cow::Borrowed(text),
        };
        out.push(Tok { kind, text: Cow::Borrowed(text), value });
    }
    Some(out)
}

/// sqlparser's tokens in the lifting's terms (any text sqlparser accepts).
fn parsed_tokens(sql: &str) -> Option<Vec<Tok<'static>>> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize().ok()?;
    Some(
        tokens
            .into_iter()
            .map(|t| {
                let (kind, value) = match &t {
                    Token::Whitespace(_) => (Kind::Space, String::new()),
                    Token::Word(w) if w.quote_style.is_none() => (Kind::Word { quoted: false }, w.value.clone()),
                    Token::Word(w) if w.quote_style == Some('"') => (Kind::Word { quoted: true }, w.value.clone()),
                    Token::Number(s, false) => (Kind::Number, s.clone()),
                    Token::SingleQuotedString(s) => (Kind::Str, s.clone()),
                    Token::LParen => (Kind::LParen, String::new()),
                    Token::RParen => (Kind::RParen, String::new()),
                    Token::LBracket => (Kind::LBracket, String::new()),
                    Token::RBracket => (Kind::RBracket, String::new()),
                    Token::Comma => (Kind::Comma, String::new()),
                    Token::Placeholder(_) | Token::DollarQuotedString(_) => (Kind::Placeholder, String::new()),
                    _ => (Kind::Other, String::new()),
                };
                // sqlparser prints a string's or quoted word's content without doubling its
                // quotes (the text would no longer parse).
                let text = match kind {
                    Kind::Str => format!("'{}'", value.replace('\'', "''")),
                    Kind::Word { quoted: true } => format!("\"{}\"", value.replace('"', "\"\"")),
                    _ => t.to_string(),
                };
                Tok { kind, text: Cow::Owned(text), value: Cow::Owned(value) }
            })
            .collect(),
    )
}

/// Lift the `_id IN (<unsigned integers>)` and `gather('t', [<unsigned integers>])` lists
/// out of `sql`; `None` when there is none, or when the text has its own placeholders or
/// strings anywhere else (see the module documentation).
pub fn lift_id_lists(sql: &str) -> Option<Lifted> {
    match fast_tokens(sql) {
        Some(tokens) => lift(&tokens),
        None => lift(&parsed_tokens(sql)?),
    }
}

fn lift(tokens: &[Tok<'_>]) -> Option<Lifted> {
    if tokens.iter().any(|t| t.kind == Kind::Placeholder) {
        return None;
    }
    let next = |mut i: usize| {
        while tokens.get(i).is_some_and(|t| t.kind == Kind::Space) {
            i += 1;
        }
        i
    };
    let is = |i: usize, k: Kind| tokens.get(i).is_some_and(|t| t.kind == k);
    let mut text = String::with_capacity(64);
    let mut lists: Vec<Vec<u64>> = Vec::new();
    let mut gathers: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        match t.kind {
            // `_id` (or `"_id"`) IN ( n, ... )
            Kind::Word { .. } if t.value == "_id" => {
                let k = next(i + 1);
                if tokens.get(k).is_some_and(|t| t.kind == (Kind::Word { quoted: false }) && t.value.eq_ignore_ascii_case("in")) && is(next(k + 1), Kind::LParen) {
                    if let Some((ids, end)) = numbers(tokens, next(k + 1), Kind::RParen, &next) {
                        lists.push(ids);
                        text.push_str(&format!("{} = ANY(${})", t.text, lists.len()));
                        i = end;
                        continue;
                    }
                }
            }
            // gather ( 'table' , [ n, ... ] )
            Kind::Word { quoted: false } if t.value.eq_ignore_ascii_case("gather") => {
                let open = next(i + 1);
                let name = next(open + 1);
                let comma = next(name + 1);
                let list = next(comma + 1);
                if is(open, Kind::LParen) && is(name, Kind::Str) && is(comma, Kind::Comma) && is(list, Kind::LBracket) {
                    if let Some((ids, end)) = numbers(tokens, list, Kind::RBracket, &next) {
                        let close = next(end);
                        if is(close, Kind::RParen) {
                            gathers.push((tokens[name].value.to_string(), lists.len()));
                            lists.push(ids);
                            text.push_str(&format!("{}({}, ${})", t.text, tokens[name].text, lists.len()));
                            i = close + 1;
                            continue;
                        }
                    }
                }
            }
            // Any other string may be a path (or anything else): not cached.
            Kind::Str => return None,
            _ => {}
        }
        text.push_str(&t.text);
        i += 1;
    }
    (!lists.is_empty()).then_some(Lifted { text, lists, gathers })
}

/// `<open> n, n, ... <close>` with the opening token at `i`: the ids and the index after the
/// closing token.
fn numbers(tokens: &[Tok<'_>], i: usize, close: Kind, next: &dyn Fn(usize) -> usize) -> Option<(Vec<u64>, usize)> {
    let mut ids = Vec::new();
    let mut i = i;
    loop {
        i = next(i + 1);
        let t = tokens.get(i)?;
        if t.kind != Kind::Number {
            return None;
        }
        ids.push(t.value.parse::<u64>().ok()?);
        i = next(i + 1);
        match tokens.get(i)?.kind {
            Kind::Comma => continue,
            k if k == close => return Some((ids, i + 1)),
            _ => return None,
        }
    }
}

/// How a cached shape runs.
type Entry = Option<Arc<PreparedQuery>>;

/// A bounded cache of prepared query shapes (least recently used first out).
pub struct PlanCache {
    capacity: usize,
    entries: Mutex<Vec<(String, Entry)>>,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache").field("capacity", &self.capacity).field("len", &self.len()).finish()
    }
}

impl Default for PlanCache {
    fn default() -> Self {
        PlanCache::new(64)
    }
}

impl PlanCache {
    /// A cache of at most `capacity` query shapes.
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache { capacity: capacity.max(1), entries: Mutex::new(Vec::new()) }
    }

    /// Forget every shape (after registering, dropping or replacing tables).
    pub fn clear(&self) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Shapes held.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The prepared plan and the values that run `sql`, when `sql` has `_id IN` lists and its
    /// shape reuses a plan (prepared on first sight); `None` means: run `sql` the usual way.
    pub async fn prepared(&self, ctx: &SessionContext, sql: &str) -> Option<(Arc<PreparedQuery>, Vec<ScalarValue>)> {
        let lifted = lift_id_lists(sql)?;
        // A gather of a path is never cached: the path may hold another store next time. Ids
        // past the table go the usual way too, which refuses them while planning, as always.
        for (t, k) in &lifted.gathers {
            let provider = ctx.table_provider(t.as_str()).await.ok()?;
            let n = provider.downcast_ref::<crate::query::ZrecordTable>()?.dataset().len();
            if lifted.lists[*k].iter().any(|&i| i >= n) {
                return None;
            }
        }
        let hit = {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            entries.iter().position(|(k, _)| *k == lifted.text).map(|at| {
                let e = entries.remove(at);
                let q = e.1.clone();
                entries.push(e);
                q
            })
        };
        let q = match hit {
            Some(q) => q,
            None => {
                let q = PreparedQuery::new(ctx, &lifted.text).await.ok().filter(|q| q.reuses_plan()).map(Arc::new);
                let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
                if entries.len() >= self.capacity {
                    entries.remove(0);
                }
                entries.push((lifted.text, q.clone()));
                q
            }
        }?;
        Some((q, lifted.lists.into_iter().map(id_list).collect()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lifts_only_unsigned_id_lists() {
        let l = lift_id_lists("SELECT x FROM t WHERE _id IN (3, 1,4 ) AND y > 2 OR t._id in(7)").unwrap();
        assert_eq!(l.text, "SELECT x FROM t WHERE _id = ANY($1) AND y > 2 OR t._id = ANY($2)");
        assert_eq!(l.lists, vec![vec![3, 1, 4], vec![7]]);
        let l = lift_id_lists("SELECT \"_id\" FROM t WHERE \"_id\" IN (18446744073709551615) -- _id IN (1)").unwrap();
        assert_eq!(l.lists, vec![vec![u64::MAX]]);
        assert!(l.text.ends_with("-- _id IN (1)"), "comments are kept as they are: {}", l.text);
        for keep in [
            "SELECT x FROM t WHERE _id IN (1, -2)",
            "SELECT x FROM t WHERE _id IN (1.5)",
            "SELECT x FROM t WHERE _id IN (1, y)",
            "SELECT x FROM t WHERE _id IN (SELECT 1)",
            "SELECT x FROM t WHERE _id NOT IN (1, 2)",
            "SELECT x FROM t WHERE _id IN ()",
            "SELECT x FROM t WHERE id IN (1, 2)",
            "SELECT x FROM t WHERE _ID IN (1, 2)",
            "SELECT x FROM 'data/root' WHERE _id IN (1, 2)",
            "SELECT x FROM t WHERE _id IN (1, 2) AND y = $1",
            "SELECT x FROM t WHERE _id IN (1, 18446744073709551616)",
            "SELECT x FROM t WHERE _id IN (1, 2",
        ] {
            assert_eq!(lift_id_lists(keep), None, "{keep}");
        }
    }

    #[test]
    fn lifts_gather_lists_and_names_their_tables() {
        let l = lift_id_lists("SELECT a FROM gather('t', [3, 1, 3]) WHERE _id IN (3) ORDER BY a").unwrap();
        assert_eq!(l.text, "SELECT a FROM gather('t', $1) WHERE _id = ANY($2) ORDER BY a");
        assert_eq!(l.lists, vec![vec![3, 1, 3], vec![3]]);
        assert_eq!(l.gathers, vec![("t".to_string(), 0)]);
        let l = lift_id_lists("select * from GATHER ( 'it''s' ,[7] ) g").unwrap();
        assert_eq!((l.text.as_str(), l.gathers), ("select * from GATHER('it''s', $1) g", vec![("it's".to_string(), 0)]));
        let l = lift_id_lists("SELECT a FROM gather('u', [5]) WHERE _id IN (1) AND a IN (SELECT a FROM gather('v', [6, 7]))").unwrap();
        assert_eq!(l.gathers, vec![("u".to_string(), 0), ("v".to_string(), 2)]);
        assert_eq!(l.lists, vec![vec![5], vec![1], vec![6, 7]]);
        // The same through sqlparser (the comment sends the text there).
        let l = lift_id_lists("SELECT a FROM gather('t', [3, 1]) /* c */").unwrap();
        assert_eq!((l.text.as_str(), l.lists), ("SELECT a FROM gather('t', $1) /* c */", vec![vec![3, 1]]));
        for keep in [
            "SELECT a FROM gather('t', [1, -2])",
            "SELECT a FROM gather('t', [1.5])",
            "SELECT a FROM gather('t', [])",
            "SELECT a FROM gather('t', 3)",
            "SELECT a FROM gather(t, [3])",
            "SELECT a FROM gather('t', [3], 4)",
            "SELECT a FROM gather('t', [3]) WHERE s = 'x'",
            "SELECT a FROM gather('t', [3]) WHERE _id = $1",
            "SELECT a FROM \"gather\"('t', [3])",
            "SELECT a FROM gather(E't', [3])",
        ] {
            assert_eq!(lift_id_lists(keep), None, "{keep}");
        }
    }

    fn lifted_by(tokens: Option<Vec<Tok<'_>>>) -> Option<Option<Lifted>> {
        tokens.map(|t| lift(&t))
    }

    /// Texts over a vocabulary that stresses the lexer's edges (whole liftable lists among
    /// them): wherever the fast lexer takes a text, it lifts exactly what sqlparser's tokens
    /// lift. Half the texts use only pieces the fast lexer takes.
    fn arb_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let safe = || {
            prop_oneof![
                Just("_id"), Just("IN"), Just("in"), Just("gather"), Just("NOT"), Just("SELECT"), Just("x"), Just("t"), Just("12"),
                Just("0"), Just("18446744073709551616"), Just("'t'"), Just("'a''b'"), Just("("), Just(")"), Just("["), Just("]"),
                Just(","), Just(" "), Just("\n"), Just("."), Just("-"), Just("/"), Just("*"), Just("::"), Just("="), Just("<>"),
                Just(" _id IN (12, 0) "), Just(" _id in(3)"), Just(" gather('t', [12, 0]) "), Just("gather ( 'a''b' , [ 0 ] )"),
                Just(" gather('t',[1,2]"), Just("_id IN (1, 2"), Just("\"_id\""), Just("\"a\"\"b\""), Just("\"gather\""), Just("\"x y\"")
            ]
        };
        let edge = prop_oneof![
            Just("\"é\""), Just("1.5"), Just("1e3"), Just("'a\\'"), Just("E'x'"), Just("--c\n"), Just("/*c*/"), Just("$1"), Just("é"),
            Just("@"), Just("#"), Just("\"")
        ];
        prop_oneof![
            proptest::collection::vec(safe(), 0..16).prop_map(|v| v.concat()),
            proptest::collection::vec(prop_oneof![4 => safe(), 1 => edge], 0..16).prop_map(|v| v.concat()),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]
        #[test]
        fn the_fast_lexer_lifts_what_sqlparser_lifts(text in arb_text()) {
            // (A text sqlparser cannot tokenize fails when it is planned, lifted or not.)
            if let (Some(fast), Some(parsed)) = (lifted_by(fast_tokens(&text)), lifted_by(parsed_tokens(&text))) {
                proptest::prop_assert_eq!(fast, parsed, "{}", text);
            }
        }
    }

    #[test]
    fn the_fast_lexer_takes_the_common_shapes() {
        for sql in [
            "SELECT x FROM t WHERE _id IN (3, 1,4 ) AND y > 2 OR t._id in(7)",
            "SELECT a FROM gather('t', [3, 1, 3]) WHERE _id IN (3) ORDER BY a;",
            "select count(*) from t where _id in (1,2) and b >= 3 and c <> 4",
            "SELECT \"_id\", \"my col\" FROM \"t\" WHERE \"_id\" IN (18446744073709551615)",
        ] {
            assert!(fast_tokens(sql).is_some(), "{sql}");
            assert_eq!(lifted_by(fast_tokens(sql)), lifted_by(parsed_tokens(sql)), "{sql}");
        }
        for other in ["SELECT \"_id FROM t", "SELECT 1 -- c", "SELECT $1", "SELECT 'a\\b'", "SELECT 1.5", "SELECT 'é'"] {
            assert!(fast_tokens(other).is_none(), "{other}");
        }
    }
}
