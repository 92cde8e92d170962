pub struct Db; #[derive(Debug, thiserror::Error)] #[error("db")] pub struct DbError;
