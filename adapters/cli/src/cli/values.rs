//! Values of flags that several subcommands share, and what they are checked against:
//! durations in seconds, the momentum coefficient, a target loss, the shared secret, the
//! memory a run may plan to use. Every subcommand module may use this one; it uses none of
//! them.

use crate::tcp::{self, Secret};
use std::path::Path;
use std::time::Duration as StdDuration;

/// The longest `--time-limit` (and `--lost-after`) accepted, in seconds: a year. Longer
/// values would overflow the clock arithmetic of the run's deadlines.
pub(super) const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// `--NAME SECS` as a duration: a positive, finite number of seconds up to [`MAX_SECONDS`].
pub(super) fn seconds(name: &str, value: f64) -> Result<StdDuration, String> {
    if !(value.is_finite() && value > 0.0 && value <= MAX_SECONDS) {
        return Err(format!(
            "invalid value '{value}' for '--{name}': must be a positive number of seconds up to {MAX_SECONDS}"
        ));
    }
    StdDuration::try_from_secs_f64(value).map_err(|e| format!("invalid value '{value}' for '--{name}': {e}"))
}

/// `--lost-after SECS` of a TCP process (see [`seconds`]): at least the transport's shortest
/// silence limit.
pub(super) fn lost_after(value: f64) -> Result<StdDuration, String> {
    let d = seconds("lost-after", value)?;
    tcp::check_lost_after(d).map_err(|e| format!("invalid value '{value}' for '--lost-after': {e}"))?;
    Ok(d)
}

/// `--time-limit SECS`, if given, as a duration (see [`seconds`]).
pub(super) fn time_limit(value: Option<f64>) -> Result<Option<StdDuration>, String> {
    value.map(|t| seconds("time-limit", t)).transpose()
}

/// A target loss: a finite number.
pub(super) fn parse_target_loss(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(l) if l.is_finite() => Ok(l),
        _ => Err(format!("the target loss must be a finite number, got '{s}'")),
    }
}

/// A momentum coefficient: a number in `[0, 1)`.
pub(super) fn parse_momentum(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(b) if b.is_finite() && (0.0..1.0).contains(&b) => Ok(b),
        _ => Err(format!("momentum must be a number in [0, 1), got '{s}'")),
    }
}

/// The shared secret from `file`, or from `$SYNCOPATE_SECRET`, or none.
pub(super) fn load_secret(file: Option<&Path>) -> Result<Option<Secret>, String> {
    match file {
        Some(path) => {
            let secret = Secret::from_file(path).map_err(|e| e.to_string())?;
            if let Some(warning) = exposed_secret_warning(path) {
                eprintln!("{warning}");
            }
            Ok(Some(secret))
        }
        None => Secret::from_env(tcp::auth::SECRET_ENV).map_err(|e| e.to_string()),
    }
}

/// A warning when the secret file at `path` can be read or written by other users (any
/// group or other permission bit): whoever reads it can join the run as any worker.
pub(super) fn exposed_secret_warning(path: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "warning: secret file {} is accessible to other users (mode {mode:o}); run: chmod 600 {}",
                path.display(),
                path.display()
            )
        })
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// The share of the available memory a run may plan to use.
pub(super) const MEMORY_SHARE: f64 = 0.5;
/// Copies of the model a TCP server holds at once: the model, the gradients it combines, the
/// encoded model it sends, and the previous model of a run with momentum.
const SERVER_MODEL_COPIES: f64 = 4.0;

/// Refuses a server model of `dim` parameters whose copies (at 4 bytes a parameter) exceed
/// the planned share of `available` bytes (unknown: not checked), before anything is
/// allocated for it.
pub(super) fn check_server_memory(dim: usize, available: Option<u64>) -> Result<(), String> {
    let estimate = SERVER_MODEL_COPIES * dim as f64 * 4.0;
    match available {
        Some(bytes) if estimate > bytes as f64 * MEMORY_SHARE => Err(format!(
            "invalid value '{dim}' for '--dim': a server of {dim} parameters would need about {:.1} GB of memory and \
             this machine has {:.1} GB available (at most half of it is planned)",
            estimate / 1e9,
            bytes as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

/// The memory available to new work (Linux `MemAvailable`), in bytes; `None` elsewhere.
pub(super) fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(all(test, unix))]
mod tests {
    use super::{check_server_memory, exposed_secret_warning};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_secret_file_others_can_read_is_warned_about_and_a_private_one_is_not() {
        let path = std::env::temp_dir().join(format!("syncopate-secret-mode-{}", std::process::id()));
        std::fs::write(&path, [7u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warning = exposed_secret_warning(&path).unwrap();
        assert!(warning.contains("mode 644") && warning.contains("chmod 600"), "{warning}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(exposed_secret_warning(&path), None);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_model_the_memory_cannot_hold_is_refused_before_it_is_allocated() {
        let gb = 1u64 << 30;
        assert!(check_server_memory(1 << 20, Some(gb)).is_ok());
        assert!(check_server_memory(1 << 30, None).is_ok(), "unknown memory is not checked");
        let e = check_server_memory(1_073_740_799, Some(8 * gb)).unwrap_err();
        assert!(e.starts_with("invalid value '1073740799' for '--dim'") && e.contains("GB"), "{e}");
    }
}

/// `--wire ENC`: `f32`, `bf16` or `fp16`.
pub(crate) fn wire(value: &str) -> Result<syncopate::wire::Encoding, String> {
    syncopate::wire::Encoding::from_name(value)
        .ok_or_else(|| format!("'{value}' is not a wire encoding: give f32, bf16 or fp16"))
}
