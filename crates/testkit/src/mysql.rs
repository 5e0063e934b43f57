//! MariaDB/MySQL URLs for benchmarks and torture runs that work in a database of their
//! own on the shared server.

/// `url` with its database (and options) replaced by `database`.
pub fn database_url(url: &str, database: &str) -> String {
    let base = (url.split_once('?').map_or(url, |(u, _)| u))
        .rsplit_once('/')
        .map_or(url, |(base, _)| base);
    format!("{base}/{database}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_replaces_the_one_of_the_url_and_drops_its_options() {
        assert_eq!(
            database_url("mysql://root@h:3306/test?ssl=false", "b"),
            "mysql://root@h:3306/b"
        );
        assert_eq!(database_url("mysql://root@h/test", "b"), "mysql://root@h/b");
    }
}
