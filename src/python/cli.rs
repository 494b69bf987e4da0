//! `zrecord._zrecord.cli_main`: the `zrec` command line inside the extension (the wheel's `zrec`
//! console script and `python -m zrecord` call it).

use pyo3::prelude::*;

/// Run the `zrec` command line with `argv` (``argv[0]`` is the program name) and return its
/// exit code. The GIL is released while the command runs (Ballista processes run until killed).
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(move || crate::cli::run(argv))
}
