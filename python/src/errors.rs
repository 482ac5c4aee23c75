//! The exceptions the module raises beyond Python's own: a state machine's refusal
//! ([`RejectedError`]) and a TCP worker's failure ([`WorkerError`]).

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};

create_exception!(_native, RejectedError, PyValueError, "A state machine refused an input; nothing changed.");
create_exception!(_native, WorkerError, PyRuntimeError, "A TCP worker ended with an error.");
