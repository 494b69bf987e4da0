//! Plan reuse for SQL text: `_id IN (<integer literals>)` lists are lifted out of a query
//! (`_id = ANY($k)`), the lifted text is prepared once ([`PreparedQuery`]) and later queries of
//! the same shape execute that plan with their own ids. A point lookup written as SQL text then
//! costs a tokenizer pass and an execution instead of parsing, analysing, optimising and
//! planning 256 literals each time.
//!
//! Only what is certain to mean the same is lifted: an `_id IN (...)` list of unsigned integer
//! literals (`IN` and `= ANY` select the same rows, in the same id order from a zrecord scan).
//! A shape whose prepared form does not reuse its physical plan (the `_id` is not a zrecord
//! table's, the list sits in a projection, ...) is remembered as such and runs the usual way.
//! Queries naming anything by a quoted string (`FROM 'path'`, `gather('t', ...)`) are not
//! cached, nor are queries with their own parameters. Entries hold their tables: call
//! [`PlanCache::clear`] after changing the catalog.

use std::sync::{Arc, Mutex};

use datafusion::common::ScalarValue;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::query::prepared::{id_list, PreparedQuery};

/// A query with its `_id IN (...)` lists lifted into parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifted {
    /// The text with each list replaced by `_id = ANY($k)`.
    pub text: String,
    /// The ids of each list, in order (`$1`, `$2`, ...).
    pub lists: Vec<Vec<u64>>,
}

fn is_id_word(t: &Token) -> bool {
    matches!(t, Token::Word(w) if w.value == "_id" && matches!(w.quote_style, None | Some('"')))
}

fn is_in_keyword(t: &Token) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("in"))
}

/// Lift the `_id IN (<unsigned integers>)` lists out of `sql`; `None` when there is none, or
/// when the text has its own placeholders or quoted strings (see the module documentation).
pub fn lift_id_lists(sql: &str) -> Option<Lifted> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize().ok()?;
    if tokens.iter().any(|t| matches!(t, Token::Placeholder(_) | Token::SingleQuotedString(_) | Token::DollarQuotedString(_))) {
        return None;
    }
    let next = |mut i: usize| {
        while matches!(tokens.get(i), Some(Token::Whitespace(_))) {
            i += 1;
        }
        i
    };
    let mut text = String::with_capacity(64);
    let mut lists: Vec<Vec<u64>> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if is_id_word(&tokens[i]) {
            if let Some((ids, end)) = id_list_at(&tokens, next(i + 1), &next) {
                lists.push(ids);
                text.push_str(&format!("{} = ANY(${})", tokens[i], lists.len()));
                i = end;
                continue;
            }
        }
        text.push_str(&tokens[i].to_string());
        i += 1;
    }
    (!lists.is_empty()).then_some(Lifted { text, lists })
}

/// `IN ( n, n, ... )` starting at token `i`: the ids and the index after `)`.
fn id_list_at(tokens: &[Token], i: usize, next: &dyn Fn(usize) -> usize) -> Option<(Vec<u64>, usize)> {
    if !tokens.get(i).is_some_and(is_in_keyword) {
        return None;
    }
    let mut i = next(i + 1);
    if tokens.get(i) != Some(&Token::LParen) {
        return None;
    }
    let mut ids = Vec::new();
    loop {
        i = next(i + 1);
        match tokens.get(i)? {
            Token::Number(s, false) => ids.push(s.parse::<u64>().ok()?),
            _ => return None,
        }
        i = next(i + 1);
        match tokens.get(i)? {
            Token::Comma => continue,
            Token::RParen => return Some((ids, i + 1)),
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
}
