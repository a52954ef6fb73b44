//! Deterministic jitter: the same job always lands on the same offset.
//!
//! The offset is `int(sha256(job_id).hexdigest(), 16) % window_ms`, the
//! 256-bit digest read big-endian and reduced byte by byte (Horner's rule in
//! `u128`, which cannot overflow since `acc < window <= u64::MAX`).

use sha2::{Digest, Sha256};

/// The offset in `[0, window_ms)` of `job_id`'s runs within its jitter window.
///
/// # Panics
/// If `window_ms` is zero: a zero window means "no jitter" and the caller
/// must not ask for an offset.
pub fn jitter_offset_ms(job_id: &str, window_ms: u64) -> u64 {
    assert!(window_ms > 0, "jitter window must be positive");
    let digest = Sha256::digest(job_id.as_bytes());
    let window = u128::from(window_ms);
    let mut acc: u128 = 0;
    for byte in digest {
        acc = ((acc << 8) | u128::from(byte)) % window;
    }
    acc as u64
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn matches_python_for_known_ids() {
        // int(hashlib.sha256(b"job-1").hexdigest(), 16) % 60000 == 41113, etc.
        assert_eq!(jitter_offset_ms("job-1", 60_000), 41_113);
        assert_eq!(jitter_offset_ms("", 60_000), 46_549);
        assert_eq!(jitter_offset_ms("nightly-report", 1), 0);
    }

    #[test]
    fn stays_inside_the_window() {
        for w in [1_u64, 2, 7, 1000, 60_000, u64::MAX] {
            for id in ["a", "b", "job-42", "ünïcode"] {
                assert!(jitter_offset_ms(id, w) < w);
            }
        }
    }

    #[test]
    #[should_panic(expected = "jitter window must be positive")]
    fn zero_window_is_refused() {
        let _ = jitter_offset_ms("a", 0);
    }
}
