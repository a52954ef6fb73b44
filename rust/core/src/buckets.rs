//! Bucket planning: where a run lives in the schedule store.
//!
//! A run is stored under `(time_bucket, shard)`: the minute of its run time
//! and a stable hash of its job id. The hash is CRC-32 (IEEE), the same as
//! Python's `zlib.crc32`, so every process and language agrees; Python's own
//! `hash()` is salted per process and would not.

/// Milliseconds per time bucket: one minute.
pub const BUCKET_MS: i64 = 60_000;

/// The minute a run time falls in, flooring for times before the epoch.
pub fn time_bucket(run_at_ms: i64) -> i64 {
    run_at_ms.div_euclid(BUCKET_MS)
}

/// The shard (and scheduling partition) of a job: `crc32(job_id) % partitions`.
///
/// # Panics
/// If `partitions` is zero.
pub fn shard_for(job_id: &str, partitions: u32) -> u32 {
    assert!(partitions > 0, "partitions must be positive");
    crc32fast::hash(job_id.as_bytes()) % partitions
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn buckets_are_minutes() {
        assert_eq!(time_bucket(0), 0);
        assert_eq!(time_bucket(59_999), 0);
        assert_eq!(time_bucket(60_000), 1);
        assert_eq!(time_bucket(-1), -1);
    }

    #[test]
    fn shard_matches_zlib_crc32() {
        // zlib.crc32(b"job-1") == 1_279_408_703
        assert_eq!(shard_for("job-1", 1000), 703);
        assert_eq!(shard_for("job-1", 64), 1_279_408_703 % 64);
        assert_eq!(shard_for("", 64), 0);
    }
}
