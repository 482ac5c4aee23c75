//! Writing to stdout as Unix tools do: a reader that went away (`| head -1`, `| true`) ends
//! the program quietly with exit code 0 instead of a panic; any other write failure is one
//! line on stderr and exit code 1.

use std::io::{ErrorKind, Write};

/// Writes `text` (its own newlines included) to stdout and flushes it.
pub(crate) fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        closed_or_failed(&e);
    }
}

/// Ends the program after a failed write to stdout (never returns).
fn closed_or_failed(e: &std::io::Error) -> ! {
    if e.kind() == ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write to stdout: {e}");
    std::process::exit(1);
}

/// A backstop for output written with `println!` (which panics on a closed stdout): such a
/// panic ends the program as [`emit`] would; every other panic keeps the default report.
pub(crate) fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// `println!` through [`emit`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;
