pub mod records;
pub mod server;
