//! The stream conformance suite (`courier_testkit::stream_suite`) on every
//! stream backend: each case runs against Redis (a fresh key prefix),
//! PostgreSQL (a fresh schema) and SQLite (a fresh file).

mod redis {
    courier_testkit::stream_backend_tests!(redis, courier_testkit::RedisStreamFixture);
}

mod postgres {
    courier_testkit::stream_backend_tests!(postgres, courier_testkit::PgStreamFixture);
}

mod sqlite {
    courier_testkit::stream_backend_tests!(sqlite, courier_testkit::SqliteStreamFixture);
}
