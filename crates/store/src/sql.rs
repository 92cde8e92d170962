//! The one small SQL interface the metadata database is written against, so
//! that the same statements run on SQLite (the embedded default) and on
//! PostgreSQL (`--database postgres://...`, see [`crate::postgres`]).
//!
//! Statements are written once, in the SQL both engines accept: numbered
//! parameters `?1`, `?2` ... (PostgreSQL's `$1` is substituted on the way
//! there), `INSERT ... ON CONFLICT ... DO UPDATE`, `RETURNING`, `->>` on JSON
//! text, and `CAST(... AS BIGINT)`. Values cross the interface as [`Value`]s
//! and rows come back as [`Row`]s of them, so neither engine's types leak into
//! the queries.

use crate::db::DbError;

/// One SQL value, as bound to a parameter or read from a column.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An integer (SQLite INTEGER, PostgreSQL SMALLINT/INTEGER/BIGINT).
    Int(i64),
    /// A float.
    Real(f64),
    /// Text (PostgreSQL TEXT and JSON columns both come back as text).
    Text(String),
    /// A boolean (SQLite stores 0/1).
    Bool(bool),
}

/// Conversion of a Rust value into a [`Value`] parameter.
pub trait ToValue {
    /// The value to bind.
    fn to_value(&self) -> Value;
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, T::to_value)
    }
}

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}

impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToValue for bool {
    fn to_value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl ToValue for f64 {
    fn to_value(&self) -> Value {
        Value::Real(*self)
    }
}

macro_rules! int_to_value {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
int_to_value!(i64, i32, u32, u16);

/// The parameters of a statement, each converted with [`ToValue`]:
/// `args![id, name, limit]`.
#[macro_export]
#[doc(hidden)]
macro_rules! args {
    () => { &[] as &[$crate::sql::Value] };
    ($($v:expr),+ $(,)?) => { &[$($crate::sql::ToValue::to_value(&$v)),+] as &[$crate::sql::Value] };
}
pub(crate) use args;

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Value>);

impl Row {
    /// Column `i` as a `T`; a missing column or another type is [`DbError::Column`].
    pub fn get<T: FromValue>(&self, i: usize) -> Result<T, DbError> {
        let v = self.0.get(i).unwrap_or(&Value::Null);
        T::from_value(v).ok_or_else(|| DbError::Column { index: i, expected: T::NAME, found: format!("{v:?}") })
    }
}

/// Conversion of a column's [`Value`] into a Rust value.
pub trait FromValue: Sized {
    /// What the column should hold (for [`DbError::Column`]).
    const NAME: &'static str;
    /// The value, or `None` when the column holds something else.
    fn from_value(v: &Value) -> Option<Self>;
}

impl<T: FromValue> FromValue for Option<T> {
    const NAME: &'static str = T::NAME;
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}

impl FromValue for String {
    const NAME: &'static str = "text";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl FromValue for bool {
    const NAME: &'static str = "boolean";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}

impl FromValue for f64 {
    const NAME: &'static str = "float";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Real(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}

macro_rules! int_from_value {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            const NAME: &'static str = stringify!($t);
            fn from_value(v: &Value) -> Option<Self> {
                match v {
                    Value::Int(i) => <$t>::try_from(*i).ok(),
                    _ => None,
                }
            }
        }
    )*};
}
int_from_value!(i64, i32, u32, u16);

/// A connection (or an open transaction) of either engine.
pub trait Sql {
    /// Runs a statement; the number of rows it changed.
    fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, DbError>;
    /// Runs a query; every row it returns.
    fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError>;
    /// Runs statements separated by `;`, with no parameters (migrations).
    fn execute_batch(&self, sql: &str) -> Result<(), DbError>;
}

/// Row mapping over [`Sql`], for any connection or transaction.
pub trait SqlExt: Sql {
    /// Runs a query and maps each row with `f`.
    fn rows<T>(&self, sql: &str, args: &[Value], f: impl Fn(&Row) -> Result<T, DbError>) -> Result<Vec<T>, DbError> {
        self.query(sql, args)?.iter().map(f).collect()
    }

    /// Runs a query and maps its first row, if any, with `f`.
    fn one<T>(
        &self,
        sql: &str,
        args: &[Value],
        f: impl FnOnce(&Row) -> Result<T, DbError>,
    ) -> Result<Option<T>, DbError> {
        self.query(sql, args)?.first().map(f).transpose()
    }

    /// Whether a query returns a row.
    fn exists(&self, sql: &str, args: &[Value]) -> Result<bool, DbError> {
        Ok(!self.query(sql, args)?.is_empty())
    }
}

impl<S: Sql + ?Sized> SqlExt for S {}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value as V, ValueRef};
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(V::Null),
            Value::Int(i) => ToSqlOutput::Owned(V::Integer(*i)),
            Value::Real(f) => ToSqlOutput::Owned(V::Real(*f)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::Bool(b) => ToSqlOutput::Owned(V::Integer(i64::from(*b))),
        })
    }
}

/// SQLite: every statement goes through the connection's statement cache
/// (parsing cost more than running the lookups of a proxied preview request,
/// measured with perf).
impl Sql for rusqlite::Connection {
    fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, DbError> {
        Ok(self.prepare_cached(sql)?.execute(rusqlite::params_from_iter(args))?)
    }

    fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
        use rusqlite::types::ValueRef;
        let mut stmt = self.prepare_cached(sql)?;
        let columns = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(columns);
            for i in 0..columns {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(i) => Value::Int(i),
                    ValueRef::Real(f) => Value::Real(f),
                    ValueRef::Text(t) | ValueRef::Blob(t) => Value::Text(
                        String::from_utf8(t.to_vec()).map_err(|e| rusqlite::Error::Utf8Error(e.utf8_error()))?,
                    ),
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }

    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        Ok(rusqlite::Connection::execute_batch(self, sql)?)
    }
}

/// `sql` with its `?N` parameters written as PostgreSQL's `$N`.
pub fn numbered_dollars(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_parameters_become_dollars_and_nothing_else_changes() {
        assert_eq!(
            numbered_dollars("SELECT a FROM t WHERE (?1 IS NULL OR b = ?1) AND c > ?12 AND d ->> 'x?' = '?'"),
            "SELECT a FROM t WHERE ($1 IS NULL OR b = $1) AND c > $12 AND d ->> 'x?' = '?'"
        );
    }

    #[test]
    fn values_convert_both_ways_and_a_wrong_type_names_the_column() {
        let row = Row(vec![Value::Int(7), Value::Null, Value::Text("x".into()), Value::Bool(true), Value::Int(-1)]);
        assert_eq!(row.get::<u32>(0).unwrap(), 7);
        assert_eq!(row.get::<Option<String>>(1).unwrap(), None);
        assert_eq!(row.get::<String>(2).unwrap(), "x");
        assert!(row.get::<bool>(3).unwrap());
        let err = row.get::<u32>(4).unwrap_err().to_string();
        assert!(err.contains("column 4") && err.contains("u32"), "{err}");
        assert!(row.get::<String>(9).is_err(), "a missing column is an error");
        assert_eq!(
            args![Some("a"), None::<i64>, 3u16, false][..],
            [Value::Text("a".into()), Value::Null, Value::Int(3), Value::Bool(false)]
        );
    }
}
