//! Graph pictures: DOT export through the driver.

use super::Graph;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CString;
use std::path::Path;

impl Graph {
    /// Writes the graph in Graphviz DOT format to `path` (`cuGraphDebugDotPrint`). With `verbose`,
    /// every node's parameters are included (`CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a path with a NUL byte; driver errors (e.g. the file cannot
    /// be written).
    pub fn write_dot(&self, path: &Path, verbose: bool) -> Result<()> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::InvalidArgument("path contains a NUL byte".into()))?;
        let flags =
            if verbose { sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32 } else { 0 };
        let _g = self.guard();
        // SAFETY: live graph, used under its lock (the driver reads the graph); NUL-terminated path.
        unsafe { result::graph_debug_dot_print(self.raw, &c, flags) }
    }
}
