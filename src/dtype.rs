//! The dtype catalog: one table mapping every supported element type to its size, its NumPy
//! type string, its DLPack `(code, bits, lanes)` and its Arrow `DataType`.
//!
//! Arrow has no native bfloat16, complex or float8 types, and its `Boolean` is bit-packed while
//! NumPy's bool is one byte. Those dtypes map to a fixed-width storage type carrying extension
//! metadata (`arrow.bool8` is canonical; the others use `zrecord.*` names), so the bytes stay
//! exactly as stored and conversion remains zero-copy.

use std::fmt;
use std::str::FromStr;

use arrow_schema::DataType;

use crate::error::{Error, Result};

/// DLPack type codes (DLPack 1.1 `DLDataTypeCode`).
pub mod dl_code {
    /// Signed integer.
    pub const INT: u8 = 0;
    /// Unsigned integer.
    pub const UINT: u8 = 1;
    /// IEEE float.
    pub const FLOAT: u8 = 2;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Complex (interleaved real, imaginary).
    pub const COMPLEX: u8 = 5;
    /// Boolean, one byte per element.
    pub const BOOL: u8 = 6;
    /// float8 e4m3fn.
    pub const FLOAT8_E4M3FN: u8 = 10;
    /// float8 e5m2.
    pub const FLOAT8_E5M2: u8 = 12;
}

/// A supported element type. Native (little) endian, fixed size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// One-byte boolean.
    Bool,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 8-bit integer.
    UInt8,
    /// Unsigned 16-bit integer.
    UInt16,
    /// Unsigned 32-bit integer.
    UInt32,
    /// Unsigned 64-bit integer.
    UInt64,
    /// IEEE half precision.
    Float16,
    /// Brain float 16.
    BFloat16,
    /// IEEE single precision.
    Float32,
    /// IEEE double precision.
    Float64,
    /// Two float32 (real, imaginary).
    Complex64,
    /// Two float64 (real, imaginary).
    Complex128,
    /// 8-bit float, 4 exponent and 3 mantissa bits, finite (no infinities).
    Float8E4M3FN,
    /// 8-bit float, 5 exponent and 2 mantissa bits.
    Float8E5M2,
}

/// One row of the catalog.
#[derive(Clone, Copy, Debug)]
pub struct DTypeInfo {
    /// The dtype.
    pub dtype: DType,
    /// Canonical name (`"float32"`), also the name NumPy / ml_dtypes use.
    pub name: &'static str,
    /// Element size in bytes.
    pub size: usize,
    /// NumPy array-interface type string (`"<f4"`); `V` for types NumPy lacks.
    pub numpy_typestr: &'static str,
    /// DLPack type code.
    pub dl_code: u8,
    /// DLPack bits per lane.
    pub dl_bits: u8,
    /// DLPack lanes.
    pub dl_lanes: u16,
    /// Extension name carried in Arrow field metadata where Arrow lacks the type.
    pub arrow_extension: Option<&'static str>,
}

use DType::*;

/// The catalog. Order is the order of [`DType::ALL`].
const CATALOG: [DTypeInfo; 17] = [
    row(Bool, "bool", 1, "|b1", dl_code::BOOL, 8, Some("arrow.bool8")),
    row(Int8, "int8", 1, "|i1", dl_code::INT, 8, None),
    row(Int16, "int16", 2, "<i2", dl_code::INT, 16, None),
    row(Int32, "int32", 4, "<i4", dl_code::INT, 32, None),
    row(Int64, "int64", 8, "<i8", dl_code::INT, 64, None),
    row(UInt8, "uint8", 1, "|u1", dl_code::UINT, 8, None),
    row(UInt16, "uint16", 2, "<u2", dl_code::UINT, 16, None),
    row(UInt32, "uint32", 4, "<u4", dl_code::UINT, 32, None),
    row(UInt64, "uint64", 8, "<u8", dl_code::UINT, 64, None),
    row(Float16, "float16", 2, "<f2", dl_code::FLOAT, 16, None),
    row(BFloat16, "bfloat16", 2, "<V2", dl_code::BFLOAT, 16, Some("zrecord.bfloat16")),
    row(Float32, "float32", 4, "<f4", dl_code::FLOAT, 32, None),
    row(Float64, "float64", 8, "<f8", dl_code::FLOAT, 64, None),
    row(Complex64, "complex64", 8, "<c8", dl_code::COMPLEX, 64, Some("zrecord.complex64")),
    row(Complex128, "complex128", 16, "<c16", dl_code::COMPLEX, 128, Some("zrecord.complex128")),
    row(Float8E4M3FN, "float8_e4m3fn", 1, "|V1", dl_code::FLOAT8_E4M3FN, 8, Some("zrecord.float8_e4m3fn")),
    row(Float8E5M2, "float8_e5m2", 1, "|V1", dl_code::FLOAT8_E5M2, 8, Some("zrecord.float8_e5m2")),
];

const fn row(
    dtype: DType,
    name: &'static str,
    size: usize,
    numpy_typestr: &'static str,
    dl_code: u8,
    dl_bits: u8,
    arrow_extension: Option<&'static str>,
) -> DTypeInfo {
    DTypeInfo { dtype, name, size, numpy_typestr, dl_code, dl_bits, dl_lanes: 1, arrow_extension }
}

impl DType {
    /// Every supported dtype, in catalog order.
    pub const ALL: [DType; 17] = [
        Bool, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64, Float16, BFloat16,
        Float32, Float64, Complex64, Complex128, Float8E4M3FN, Float8E5M2,
    ];

    /// The catalog row of this dtype.
    pub fn info(self) -> &'static DTypeInfo {
        // The catalog is laid out in declaration order; a unit test checks this.
        &CATALOG[self as usize]
    }

    /// Canonical name, e.g. `"bfloat16"`.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Element size in bytes.
    pub fn size(self) -> usize {
        self.info().size
    }

    /// DLPack `(code, bits, lanes)`.
    pub fn dlpack(self) -> (u8, u8, u16) {
        let i = self.info();
        (i.dl_code, i.dl_bits, i.dl_lanes)
    }

    /// The dtype with the given DLPack `(code, bits, lanes)`, if supported.
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Result<DType> {
        CATALOG
            .iter()
            .find(|r| r.dl_code == code && r.dl_bits == bits && r.dl_lanes == lanes)
            .map(|r| r.dtype)
            .ok_or_else(|| Error::UnknownDtype {
                name: format!("DLPack(code={code}, bits={bits}, lanes={lanes})"),
                supported: supported_names(),
            })
    }

    /// Look a dtype up by name. Accepts the canonical names, NumPy type strings (`"<f4"`,
    /// `"f4"`, `"=f4"`) and the common aliases `float`, `double`, `half`, `bf16`.
    pub fn from_name(name: &str) -> Result<DType> {
        let n = name.trim();
        let alias = match n {
            "float" | "f32" => Some(Float32),
            "double" | "f64" => Some(Float64),
            "half" | "f16" => Some(Float16),
            "bf16" => Some(BFloat16),
            "i8" => Some(Int8),
            "i16" => Some(Int16),
            "i32" => Some(Int32),
            "i64" => Some(Int64),
            "u8" => Some(UInt8),
            "u16" => Some(UInt16),
            "u32" => Some(UInt32),
            "u64" => Some(UInt64),
            "?" | "b1" => Some(Bool),
            _ => None,
        };
        if let Some(d) = alias {
            return Ok(d);
        }
        for r in &CATALOG {
            if r.name == n {
                return Ok(r.dtype);
            }
            // NumPy strings without a byte-order mark, or with native '=' / little '<' / '|'.
            if !r.numpy_typestr.starts_with(['<', '|'])
                || r.numpy_typestr.contains('V')
            {
                continue;
            }
            let body = &r.numpy_typestr[1..];
            if n == r.numpy_typestr
                || n == body
                || n.strip_prefix('=') == Some(body)
                || n.strip_prefix('<') == Some(body)
                || n.strip_prefix('|') == Some(body)
            {
                return Ok(r.dtype);
            }
        }
        Err(Error::UnknownDtype { name: name.to_string(), supported: supported_names() })
    }

    /// The Arrow storage type of one element. Where Arrow lacks the type, this is a
    /// same-width storage type and [`DType::arrow_extension`] names the extension.
    pub fn arrow_type(self) -> DataType {
        match self {
            Bool => DataType::Int8,
            Int8 => DataType::Int8,
            Int16 => DataType::Int16,
            Int32 => DataType::Int32,
            Int64 => DataType::Int64,
            UInt8 => DataType::UInt8,
            UInt16 => DataType::UInt16,
            UInt32 => DataType::UInt32,
            UInt64 => DataType::UInt64,
            Float16 => DataType::Float16,
            BFloat16 => DataType::UInt16,
            Float32 => DataType::Float32,
            Float64 => DataType::Float64,
            Complex64 => DataType::FixedSizeBinary(8),
            Complex128 => DataType::FixedSizeBinary(16),
            Float8E4M3FN | Float8E5M2 => DataType::UInt8,
        }
    }

    /// Extension name attached to the Arrow field (`ARROW:extension:name`), if any.
    pub fn arrow_extension(self) -> Option<&'static str> {
        self.info().arrow_extension
    }

    /// The dtype an Arrow element field describes: its storage type plus extension name.
    pub fn from_arrow(data_type: &DataType, extension: Option<&str>) -> Result<DType> {
        if let Some(ext) = extension {
            if let Some(r) = CATALOG.iter().find(|r| r.arrow_extension == Some(ext)) {
                if &r.dtype.arrow_type() == data_type {
                    return Ok(r.dtype);
                }
            }
        }
        CATALOG
            .iter()
            .find(|r| r.arrow_extension.is_none() && &r.dtype.arrow_type() == data_type)
            .map(|r| r.dtype)
            .ok_or_else(|| Error::UnknownDtype {
                name: format!("arrow {data_type}{}", extension.map(|e| format!(" ({e})")).unwrap_or_default()),
                supported: supported_names(),
            })
    }
}

fn supported_names() -> String {
    CATALOG.iter().map(|r| r.name).collect::<Vec<_>>().join(", ")
}

impl serde::Serialize for DType {
    /// As its catalog name (`"float32"`, ...).
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    /// From a catalog name; an unknown one is an error naming the catalog.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<DType, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<DType> {
        DType::from_name(s)
    }
}

/// Rust element types with a catalog dtype, for typed views of record bytes.
///
/// # Safety
/// Implementors must be plain-old-data: every bit pattern valid, no padding, size equal to
/// `DTYPE.size()`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The matching catalog entry.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:expr),*) => {$(
        // SAFETY: primitive integers and floats are POD with the catalog's size.
        unsafe impl Element for $t { const DTYPE: DType = $d; }
    )*};
}
element!(i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64, u8 => UInt8, u16 => UInt16,
         u32 => UInt32, u64 => UInt64, f32 => Float32, f64 => Float64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_in_declaration_order() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(CATALOG[i].dtype, *d);
            assert_eq!(d.info().dtype, *d);
        }
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            let (c, b, l) = d.dlpack();
            assert_eq!(DType::from_dlpack(c, b, l).unwrap(), d);
            assert_eq!(DType::from_arrow(&d.arrow_type(), d.arrow_extension()).unwrap(), d);
            assert_eq!(usize::from(d.info().dl_bits) / 8, d.size());
        }
    }

    #[test]
    fn numpy_strings() {
        assert_eq!(DType::from_name("<f4").unwrap(), Float32);
        assert_eq!(DType::from_name("f8").unwrap(), Float64);
        assert_eq!(DType::from_name("=i2").unwrap(), Int16);
        assert_eq!(DType::from_name("|u1").unwrap(), UInt8);
        assert_eq!(DType::from_name("<c16").unwrap(), Complex128);
        assert_eq!(DType::from_name("|b1").unwrap(), Bool);
    }

    #[test]
    fn unknown_names_are_errors() {
        for bad in ["float128", ">f4", "object", "", "U10", "datetime64"] {
            let e = DType::from_name(bad).unwrap_err();
            assert!(matches!(e, Error::UnknownDtype { .. }), "{bad}");
            assert!(e.to_string().contains("float32"));
        }
        assert!(DType::from_dlpack(2, 128, 1).is_err());
        assert!(DType::from_dlpack(2, 32, 4).is_err());
        assert!(DType::from_arrow(&DataType::Utf8, None).is_err());
    }
}
