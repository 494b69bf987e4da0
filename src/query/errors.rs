//! Errors across the DataFusion boundary: a zrecord error travels through DataFusion whole
//! (`DataFusionError::External`) and comes back as itself; a DataFusion error becomes
//! [`Error::External`] with `what = "DataFusion"`, and goes back unwrapped.

use datafusion::error::DataFusionError;

use crate::error::Error;

/// What an [`Error::External`] holding a DataFusion error names.
const WHAT: &str = "DataFusion";

impl From<DataFusionError> for Error {
    /// A zrecord error that went through DataFusion comes back as itself.
    fn from(e: DataFusionError) -> Self {
        match e {
            DataFusionError::External(b) => match b.downcast::<Error>() {
                Ok(z) => *z,
                Err(other) => Error::External { what: WHAT, source: Box::new(DataFusionError::External(other)) },
            },
            other => Error::External { what: WHAT, source: Box::new(other) },
        }
    }
}

impl From<Error> for DataFusionError {
    /// Kept whole (callers can downcast it back); a wrapped DataFusion error is unwrapped.
    fn from(e: Error) -> Self {
        match e {
            Error::External { what: WHAT, source } => match source.downcast::<DataFusionError>() {
                Ok(d) => *d,
                Err(other) => DataFusionError::External(Box::new(Error::External { what: WHAT, source: other })),
            },
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// The zrecord error inside a DataFusion error (anywhere in its source chain), if that is
/// what it is.
pub(crate) fn zrecord_error_in(e: &DataFusionError) -> Option<&Error> {
    crate::error::find_in(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_the_datafusion_boundary_whole() {
        let e = Error::corrupt("/x", "bad");
        let d: DataFusionError = e.into();
        let back: Error = d.into();
        assert!(matches!(back, Error::Corrupt { .. }));
        let plain: Error = DataFusionError::Plan("no".into()).into();
        assert!(matches!(plain, Error::External { what: "DataFusion", .. }));
        assert!(plain.to_string().starts_with("DataFusion error: "), "{plain}");
        let d2: DataFusionError = plain.into();
        assert!(matches!(d2, DataFusionError::Plan(_)));
        let nested = DataFusionError::Context("scan".into(), Box::new(DataFusionError::External(Box::new(Error::OutOfMemory { bytes: 3 }))));
        assert!(matches!(zrecord_error_in(&nested), Some(Error::OutOfMemory { bytes: 3 })));
        let as_error: Error = nested.into();
        assert!(matches!(as_error.root(), Error::OutOfMemory { bytes: 3 }));
    }
}
