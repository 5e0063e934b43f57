//! What a DDL statement of the binary log does to the tables it names (pure): the
//! stream stops at a change of a captured table's shape, lets added columns flow
//! through, and ignores what keeps the rows as they are (indexes, defaults, options).
//!
//! ```text
//!  ALTER TABLE t ADD [COLUMN] c …            AddsColumns [t]   (described again)
//!  ALTER TABLE t ADD INDEX/KEY/… , ALTER c SET DEFAULT, ENGINE=…, DROP INDEX …
//!  CREATE/DROP INDEX … ON t                  Harmless
//!  ALTER TABLE t DROP/MODIFY/CHANGE/RENAME/CONVERT …, DROP TABLE, TRUNCATE,
//!  RENAME TABLE a TO b, CREATE OR REPLACE TABLE t   Changes [t…]
//! ```
//!
//! Only the statement's target tables count: a table a statement merely mentions
//! (`REFERENCES t`, `CREATE TABLE u LIKE t`) is not changed by it.

/// A table as a statement names it: `t`, `` `t` ``, `db.t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub schema: Option<String>,
    pub table: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ddl {
    /// Not DDL on a table (DML, a view, a user, a database).
    None,
    /// Leaves the rows of its table as they are.
    Harmless,
    /// Adds columns (and maybe indexes): new columns flow through.
    AddsColumns(Vec<Named>),
    /// Changes the tables' shape or rows without row events.
    Changes(Vec<Named>),
}

/// The statement's words, lower case, comments and backquotes gone; `,`, `(`, `)`
/// and `;` as words of their own.
fn words(sql: &str) -> Vec<String> {
    let mut text = String::with_capacity(sql.len());
    let mut rest = sql;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, r)| r);
            text.push(' ');
        } else if let Some(after) = rest.strip_prefix("-- ").or(rest.strip_prefix("#")) {
            rest = after.split_once('\n').map_or("", |(_, r)| r);
            text.push(' ');
        } else {
            let c = rest.chars().next().expect("not empty");
            match c {
                ',' | '(' | ')' | ';' => {
                    text.push(' ');
                    text.push(c);
                    text.push(' ');
                }
                '`' => {}
                c => text.extend(c.to_lowercase()),
            }
            rest = &rest[c.len_utf8()..];
        }
    }
    text.split_whitespace().map(str::to_string).collect()
}

fn named(word: &str) -> Named {
    match word.split_once('.') {
        Some((schema, table)) => Named {
            schema: Some(schema.to_string()),
            table: table.to_string(),
        },
        None => Named {
            schema: None,
            table: word.to_string(),
        },
    }
}

/// Skips the optional words `skip` at `at`, in order.
fn skip(words: &[String], mut at: usize, skip: &[&str]) -> usize {
    for w in skip {
        if words.get(at).is_some_and(|x| x == w) {
            at += 1;
        }
    }
    at
}

/// Classifies one statement (see the module docs).
pub fn classify(sql: &str) -> Ddl {
    let w = words(sql);
    let word = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    match word(0) {
        "alter" => {
            let at = skip(&w, 1, &["online", "ignore"]);
            if word(at) != "table" {
                return Ddl::None;
            }
            let at = skip(&w, at + 1, &["if", "exists"]);
            let table = named(word(at));
            alter(&w[at + 1..], table)
        }
        "drop" => {
            let at = skip(&w, 1, &["temporary"]);
            match word(at) {
                "table" | "tables" => {
                    let at = skip(&w, at + 1, &["if", "exists"]);
                    Ddl::Changes(list(&w[at..]))
                }
                "index" => Ddl::Harmless,
                _ => Ddl::None,
            }
        }
        "truncate" => {
            let at = skip(&w, 1, &["table"]);
            Ddl::Changes(vec![named(word(at))])
        }
        "rename" if matches!(word(1), "table" | "tables") => Ddl::Changes(
            w[2..]
                .iter()
                .filter(|x| !matches!(x.as_str(), "to" | ","))
                .map(|x| named(x))
                .collect(),
        ),
        "create" => {
            let replace = word(1) == "or" && word(2) == "replace";
            let at = skip(&w, if replace { 3 } else { 1 }, &["temporary"]);
            match word(at) {
                "table" if replace => {
                    let at = skip(&w, at + 1, &["if", "not", "exists"]);
                    Ddl::Changes(vec![named(word(at))])
                }
                "unique" | "fulltext" | "spatial" | "index" => Ddl::Harmless,
                _ => Ddl::None,
            }
        }
        _ => Ddl::None,
    }
}

/// Table names up to the end or an option word.
fn list(words: &[String]) -> Vec<Named> {
    words
        .iter()
        .take_while(|x| !matches!(x.as_str(), "wait" | "nowait" | "restrict" | "cascade" | ";"))
        .filter(|x| x.as_str() != ",")
        .map(|x| named(x))
        .collect()
}

/// What `ALTER TABLE table <rest>` does, clause by clause.
fn alter(rest: &[String], table: Named) -> Ddl {
    let mut adds = false;
    let mut clause_start = true;
    let mut depth = 0usize;
    for (i, word) in rest.iter().enumerate() {
        match word.as_str() {
            "(" => depth += 1,
            ")" => depth = depth.saturating_sub(1),
            "," if depth == 0 => {
                clause_start = true;
                continue;
            }
            _ => {}
        }
        if !clause_start || depth > 0 && word != "(" {
            continue;
        }
        clause_start = false;
        let next = rest.get(i + 1).map(String::as_str).unwrap_or("");
        match word.as_str() {
            "add" => match next {
                "index" | "key" | "unique" | "fulltext" | "spatial" | "constraint" | "foreign"
                | "check" | "period" | "system" => {}
                "primary" => return Ddl::Changes(vec![table]),
                _ => adds = true,
            },
            "drop" => match next {
                "index" | "key" | "foreign" | "constraint" | "check" => {}
                _ => return Ddl::Changes(vec![table]),
            },
            "modify" | "change" | "rename" | "convert" | "partition" | "remove" | "exchange"
            | "truncate" | "discard" | "import" => {
                return Ddl::Changes(vec![table]);
            }
            _ => {}
        }
    }
    match adds {
        true => Ddl::AddsColumns(vec![table]),
        false => Ddl::Harmless,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> Named {
        named(name)
    }

    #[test]
    fn statements_change_only_their_target_tables() {
        for (sql, expected) in [
            (
                "ALTER TABLE `shop`.`items` ADD COLUMN note VARCHAR(10) DEFAULT 'n'",
                Ddl::AddsColumns(vec![t("shop.items")]),
            ),
            (
                "alter table items add (a int, b int), add index (a)",
                Ddl::AddsColumns(vec![t("items")]),
            ),
            ("ALTER TABLE items ADD INDEX i (qty)", Ddl::Harmless),
            (
                "ALTER TABLE items ALTER COLUMN qty SET DEFAULT 1",
                Ddl::Harmless,
            ),
            (
                "ALTER TABLE items DROP INDEX i, ENGINE=InnoDB",
                Ddl::Harmless,
            ),
            (
                "ALTER TABLE items DROP COLUMN qty",
                Ddl::Changes(vec![t("items")]),
            ),
            (
                "ALTER TABLE items ADD c INT, MODIFY qty BIGINT",
                Ddl::Changes(vec![t("items")]),
            ),
            (
                "DROP TABLE IF EXISTS `items`,`other` /* generated by server */",
                Ddl::Changes(vec![t("items"), t("other")]),
            ),
            (
                "TRUNCATE TABLE shop.items",
                Ddl::Changes(vec![t("shop.items")]),
            ),
            (
                "RENAME TABLE items TO old, fresh TO items",
                Ddl::Changes(vec![t("items"), t("old"), t("fresh"), t("items")]),
            ),
            (
                "CREATE OR REPLACE TABLE items (id INT PRIMARY KEY)",
                Ddl::Changes(vec![t("items")]),
            ),
            ("CREATE TABLE copy LIKE items", Ddl::None),
            (
                "CREATE TABLE lines (id INT, item BIGINT REFERENCES items (id))",
                Ddl::None,
            ),
            ("CREATE UNIQUE INDEX i ON items (name)", Ddl::Harmless),
            ("DROP INDEX i ON items", Ddl::Harmless),
            ("INSERT INTO items VALUES (1)", Ddl::None),
            (
                "/* c */ ALTER TABLE items DROP qty",
                Ddl::Changes(vec![t("items")]),
            ),
        ] {
            assert_eq!(classify(sql), expected, "{sql}");
        }
    }
}
