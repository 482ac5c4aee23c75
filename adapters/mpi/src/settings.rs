//! The settings hash: under `mpirun` every rank gets the same command line, so each rank
//! derives the run's settings from its own arguments; rank 0 then checks that every rank
//! hashed the same settings and refuses a mismatch (see `agree_on_settings`).

/// FNV-1a (64 bit) of `parts`, each part followed by a NUL so that `["ab", "c"]` and
/// `["a", "bc"]` differ. Stable across builds and machines (unlike std's `DefaultHasher`).
pub fn settings_hash<I, S>(parts: I) -> u64
where
    I: IntoIterator<Item = S>,
    S: AsRef<[u8]>,
{
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for part in parts {
        for b in part.as_ref().iter().chain(&[0u8]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_separates_parts_and_is_stable() {
        assert_ne!(settings_hash(["ab", "c"]), settings_hash(["a", "bc"]));
        assert_ne!(settings_hash(["--workers", "4"]), settings_hash(["--workers", "5"]));
        assert_eq!(settings_hash(["x"]), settings_hash(vec![String::from("x")]));
        // FNV-1a of "a\0": a fixed value, so every build and machine agrees.
        assert_eq!(settings_hash(["a"]), 0x089b_e207_b544_f1e4);
    }
}
