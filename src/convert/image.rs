//! Encoded image columns (Hugging Face `Image`: `struct<bytes: binary, path: string>`) decoded
//! in parallel into uint8 pixel tensors: ragged `HWC` / `CHW` records of native sizes, or dense
//! records of one size with `resize`.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, ListArray, UInt64Array, UInt8Array};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef};
#[cfg(feature = "images")]
use image::DynamicImage;
use rayon::prelude::*;

use crate::arrow::{fixed_shape_column, variable_shape_column};
use crate::error::{Error, Result};

/// The largest encoded image file an image column's path may name.
const MAX_IMAGE_FILE_BYTES: u64 = 1 << 30;

/// Axis order of decoded pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageLayout {
    /// Height, width, channels (Pillow / NumPy order).
    Hwc,
    /// Channels, height, width (PyTorch order).
    Chw,
}

impl FromStr for ImageLayout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_uppercase().as_str() {
            "HWC" => Ok(ImageLayout::Hwc),
            "CHW" => Ok(ImageLayout::Chw),
            _ => Err(Error::invalid("decode_images", format!("'{s}': expected \"HWC\" or \"CHW\""))),
        }
    }
}

/// Pixel format images are converted to (as Pillow's `Image.convert(mode)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageMode {
    /// 8-bit grey, 1 channel.
    L,
    /// 8-bit grey + alpha, 2 channels.
    La,
    /// 8-bit RGB, 3 channels.
    Rgb,
    /// 8-bit RGBA, 4 channels.
    Rgba,
}

impl ImageMode {
    /// Channels per pixel.
    pub fn channels(self) -> usize {
        match self {
            ImageMode::L => 1,
            ImageMode::La => 2,
            ImageMode::Rgb => 3,
            ImageMode::Rgba => 4,
        }
    }
}

impl FromStr for ImageMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_uppercase().as_str() {
            "L" => Ok(ImageMode::L),
            "LA" => Ok(ImageMode::La),
            "RGB" => Ok(ImageMode::Rgb),
            "RGBA" => Ok(ImageMode::Rgba),
            _ => Err(Error::invalid("image_mode", format!("'{s}': expected \"L\", \"LA\", \"RGB\" or \"RGBA\""))),
        }
    }
}

/// How image columns are decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageOptions {
    /// Axis order.
    pub layout: ImageLayout,
    /// Convert every image to this pixel format; `None` keeps each image's own 8-bit format
    /// (grey, grey+alpha, RGB, RGBA; palette images expand to RGB(A)).
    pub mode: Option<ImageMode>,
    /// Resize every image to `(height, width)` (bilinear): the column becomes dense.
    pub resize: Option<(u32, u32)>,
}

impl ImageOptions {
    /// Decode to `layout`, native pixel formats, native sizes.
    pub fn new(layout: ImageLayout) -> ImageOptions {
        ImageOptions { layout, mode: None, resize: None }
    }
}

/// One decoded image: `pixels` in the requested layout.
struct Decoded {
    shape: [u64; 3],
    channels: usize,
    pixels: Vec<u8>,
}

#[cfg(feature = "images")]
/// Pillow's `Image.convert(mode)` of a decoded image, pixel for pixel: grey from colour is
/// ITU-R 601-2 luma in Pillow's fixed point (`(R*19595 + G*38470 + B*7471 + 0x8000) >> 16`),
/// alpha dropped when the target has none and 255 when the source has none. Sources are taken
/// as Pillow opens them: 16-bit colour (and grey+alpha) keeps the high byte of each sample,
/// 16-bit grey (Pillow's `I;16`) clips to 255; palette images arrive expanded to RGB(A).
fn pillow_convert(img: DynamicImage, mode: ImageMode) -> std::result::Result<DynamicImage, String> {
    // The image as Pillow opens it: 8-bit samples in 1, 2, 3 or 4 channels.
    let (w, h) = (img.width(), img.height());
    let (src, c): (Vec<u8>, usize) = match img {
        DynamicImage::ImageLuma8(i) => (i.into_raw(), 1),
        DynamicImage::ImageLumaA8(i) => (i.into_raw(), 2),
        DynamicImage::ImageRgb8(i) => (i.into_raw(), 3),
        DynamicImage::ImageRgba8(i) => (i.into_raw(), 4),
        DynamicImage::ImageLuma16(i) => (i.into_raw().into_iter().map(|v| v.min(255) as u8).collect(), 1),
        DynamicImage::ImageLumaA16(i) => (i.into_raw().into_iter().map(|v| (v >> 8) as u8).collect(), 2),
        DynamicImage::ImageRgb16(i) => (i.into_raw().into_iter().map(|v| (v >> 8) as u8).collect(), 3),
        DynamicImage::ImageRgba16(i) => (i.into_raw().into_iter().map(|v| (v >> 8) as u8).collect(), 4),
        other => return Err(format!("{:?} pixels cannot be converted to {mode:?}", other.color())),
    };
    let luma = |p: &[u8]| -> u8 { ((p[0] as u32 * 19595 + p[1] as u32 * 38470 + p[2] as u32 * 7471 + 0x8000) >> 16) as u8 };
    let n = w as usize * h as usize;
    let out_c = mode.channels();
    let mut out = Vec::with_capacity(n * out_c);
    for p in src.chunks_exact(c) {
        let (grey, rgb, alpha) = match c {
            1 => (p[0], [p[0]; 3], 255),
            2 => (p[0], [p[0]; 3], p[1]),
            3 => (luma(p), [p[0], p[1], p[2]], 255),
            _ => (luma(p), [p[0], p[1], p[2]], p[3]),
        };
        match mode {
            ImageMode::L => out.push(grey),
            ImageMode::La => out.extend_from_slice(&[grey, alpha]),
            ImageMode::Rgb => out.extend_from_slice(&rgb),
            ImageMode::Rgba => out.extend_from_slice(&[rgb[0], rgb[1], rgb[2], alpha]),
        }
    }
    let short = || format!("decoded image has {} samples, not {}x{}x{c}", src.len(), w, h);
    Ok(match mode {
        ImageMode::L => DynamicImage::ImageLuma8(image::GrayImage::from_raw(w, h, out).ok_or_else(short)?),
        ImageMode::La => DynamicImage::ImageLumaA8(image::GrayAlphaImage::from_raw(w, h, out).ok_or_else(short)?),
        ImageMode::Rgb => DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, out).ok_or_else(short)?),
        ImageMode::Rgba => DynamicImage::ImageRgba8(image::RgbaImage::from_raw(w, h, out).ok_or_else(short)?),
    })
}

/// Without the `images` feature there is no decoder: a typed error naming the column.
#[cfg(not(feature = "images"))]
fn decode_one(column: &str, _row: u64, _bytes: &[u8], _opts: &ImageOptions) -> Result<Decoded> {
    Err(Error::invalid("column", format!("image column '{column}': this build of zrecord has no image decoders (feature `images`); store the encoded bytes instead")))
}

#[cfg(feature = "images")]
fn decode_one(column: &str, row: u64, bytes: &[u8], opts: &ImageOptions) -> Result<Decoded> {
    let bad = |why: String| Error::invalid("column", format!("image column '{column}' row {row}: {why}"));
    let img = image::load_from_memory(bytes).map_err(|e| bad(format!("cannot decode image: {e}")))?;
    let mut img = match opts.mode {
        Some(mode) => pillow_convert(img, mode).map_err(bad)?,
        None => match img {
            DynamicImage::ImageLuma8(_) | DynamicImage::ImageLumaA8(_) | DynamicImage::ImageRgb8(_) | DynamicImage::ImageRgba8(_) => img,
            other => {
                return Err(bad(format!(
                    "{:?} pixels are not 8-bit; pass image_mode=\"L\" / \"RGB\" / \"RGBA\" to convert them",
                    other.color()
                )))
            }
        },
    };
    if let Some((h, w)) = opts.resize {
        img = img.resize_exact(w, h, image::imageops::FilterType::Triangle);
    }
    let (w, h) = (img.width() as usize, img.height() as usize);
    let c = img.color().channel_count() as usize;
    let hwc = img.into_bytes();
    debug_assert_eq!(hwc.len(), h * w * c);
    let (pixels, shape) = match opts.layout {
        ImageLayout::Hwc => (hwc, [h as u64, w as u64, c as u64]),
        ImageLayout::Chw => {
            let mut chw = vec![0u8; hwc.len()];
            for (p, px) in hwc.chunks_exact(c).enumerate() {
                for (k, &v) in px.iter().enumerate() {
                    chw[k * h * w + p] = v;
                }
            }
            (chw, [c as u64, h as u64, w as u64])
        }
    };
    Ok(Decoded { shape, channels: c, pixels })
}

/// The encoded bytes of every row: `bytes` when present, else the file at `path`.
fn encoded_rows<'a>(column: &str, array: &'a dyn Array, base: u64) -> Result<Vec<Cow<'a, [u8]>>> {
    let n = array.len();
    let (bytes, paths): (Option<&'a dyn Array>, Option<&'a dyn Array>) = match array.data_type() {
        DataType::Struct(_) => {
            let s = array.as_struct();
            (s.column_by_name("bytes").map(|a| a.as_ref()), s.column_by_name("path").map(|a| a.as_ref()))
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => (Some(array), None),
        dt => return Err(Error::invalid("column", format!("image column '{column}' has Arrow type {dt}; expected struct<bytes, path> or binary"))),
    };
    let get_bytes = |i: usize| -> Option<&'a [u8]> {
        let a = bytes?;
        if a.is_null(i) || array.is_null(i) {
            return None;
        }
        Some(match a.data_type() {
            DataType::Binary => a.as_binary::<i32>().value(i),
            DataType::LargeBinary => a.as_binary::<i64>().value(i),
            DataType::BinaryView => a.as_binary_view().value(i),
            _ => return None,
        })
    };
    let get_path = |i: usize| -> Option<&'a str> {
        let a = paths?;
        if a.is_null(i) || array.is_null(i) {
            return None;
        }
        Some(match a.data_type() {
            DataType::Utf8 => a.as_string::<i32>().value(i),
            DataType::LargeUtf8 => a.as_string::<i64>().value(i),
            DataType::Utf8View => a.as_string_view().value(i),
            _ => return None,
        })
    };
    (0..n)
        .map(|i| match (get_bytes(i), get_path(i)) {
            (Some(b), _) => Ok(Cow::Borrowed(b)),
            (None, Some(p)) => crate::io::read_bounded(std::path::Path::new(p), MAX_IMAGE_FILE_BYTES)
                .map(Cow::Owned)
                .map_err(|e| e.context(format!("image column '{column}' row {}: no bytes, reading its path", base + i as u64))),
            (None, None) => Err(Error::invalid(
                "column",
                format!("image column '{column}' has a null at row {}; zrecord stores hold no nulls (filter or fill them first)", base + i as u64),
            )),
        })
        .collect()
}

/// Decode one batch of an image column (rows `base..`) into the Arrow column the store layout
/// takes: `arrow.variable_shape_tensor` (native sizes) or `arrow.fixed_shape_tensor` (resized).
/// Decoding runs on the rayon pool; an undecodable image is an error naming its row.
pub(crate) fn decode_column(column: &str, array: &dyn Array, opts: &ImageOptions, base: u64, channels: &mut Option<usize>) -> Result<(FieldRef, ArrayRef)> {
    let rows = encoded_rows(column, array, base)?;
    let decoded: Vec<Decoded> =
        rows.par_iter().enumerate().map(|(i, b)| decode_one(column, base + i as u64, b, opts)).collect::<Result<_>>()?;
    let total: usize = decoded.iter().map(|d| d.pixels.len()).sum();
    let mut values = Vec::with_capacity(total);
    for d in &decoded {
        values.extend_from_slice(&d.pixels);
    }
    let values = UInt8Array::from(values);
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    if opts.resize.is_some() {
        // Dense: every image has the same shape once its channel count agrees.
        for (i, d) in decoded.iter().enumerate() {
            let want = *channels.get_or_insert(d.channels);
            if d.channels != want {
                return Err(Error::invalid(
                    "column",
                    format!(
                        "image column '{column}' row {} has {} channels, earlier rows {want}; pass image_mode=\"L\" / \"RGB\" / \"RGBA\" for one pixel format",
                        base + i as u64,
                        d.channels
                    ),
                ));
            }
        }
        let shape = dense_shape(opts, channels.unwrap_or(3));
        let per: usize = shape.iter().product::<u64>() as usize;
        let arr = FixedSizeListArray::try_new(item.clone(), per as i32, Arc::new(values), None)?;
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        return Ok(fixed_shape_column(column, arr, &shape));
    }
    let mut offsets = Vec::with_capacity(decoded.len() + 1);
    offsets.push(0i32);
    let mut end = 0usize;
    for d in &decoded {
        end += d.pixels.len();
        offsets.push(i32::try_from(end).map_err(|_| Error::TooManyValues { count: end as u64, limit: i32::MAX as u64 })?);
    }
    let data = ListArray::try_new(item, OffsetBuffer::new(ScalarBuffer::from(offsets)), Arc::new(values), None)?;
    let shapes = UInt64Array::from(decoded.iter().flat_map(|d| d.shape).collect::<Vec<u64>>());
    let shape = FixedSizeListArray::try_new(Arc::new(Field::new("item", DataType::UInt64, false)), 3, Arc::new(shapes), None)?;
    variable_shape_column(column, data, shape)
}

/// The item shape of a resized image column with `channels` channels.
pub(crate) fn dense_shape(opts: &ImageOptions, channels: usize) -> Vec<u64> {
    let (h, w) = opts.resize.unwrap_or((0, 0));
    match opts.layout {
        ImageLayout::Hwc => vec![h as u64, w as u64, channels as u64],
        ImageLayout::Chw => vec![channels as u64, h as u64, w as u64],
    }
}

#[cfg(all(test, feature = "images"))]
mod tests {
    use super::*;
    use arrow_array::BinaryArray;

    fn png(w: u32, h: u32, rgb: bool) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        let img = if rgb {
            DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x * y) as u8])))
        } else {
            DynamicImage::ImageLuma8(image::GrayImage::from_fn(w, h, |x, y| image::Luma([(x + 2 * y) as u8])))
        };
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn decodes_native_sizes_in_hwc_and_chw() {
        let col = BinaryArray::from(vec![&png(3, 2, true)[..], &png(4, 5, false)[..]]);
        let (_, hwc) = decode_column("img", &col, &ImageOptions::new(ImageLayout::Hwc), 0, &mut None).unwrap();
        let s = hwc.as_struct();
        let shapes = s.column(1).as_fixed_size_list().values().as_primitive::<arrow_array::types::UInt64Type>().values().to_vec();
        assert_eq!(shapes, vec![2, 3, 3, 5, 4, 1]);
        let px = s.column(0).as_list::<i32>().value(0);
        let px = px.as_primitive::<arrow_array::types::UInt8Type>().values().to_vec();
        // Row 0 pixel (y=1, x=2) is [2, 1, 2].
        assert_eq!(&px[(3 + 2) * 3..(3 + 2) * 3 + 3], &[2, 1, 2]);
        let (_, chw) = decode_column("img", &col, &ImageOptions::new(ImageLayout::Chw), 0, &mut None).unwrap();
        let px2 = chw.as_struct().column(0).as_list::<i32>().value(0);
        let px2 = px2.as_primitive::<arrow_array::types::UInt8Type>().values().to_vec();
        // Channel 1 (green = y) plane of a 2x3 image.
        assert_eq!(&px2[6..12], &[0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn resize_needs_one_channel_count_and_bad_bytes_name_the_row() {
        let col = BinaryArray::from(vec![&png(3, 2, true)[..], &png(4, 5, false)[..]]);
        let opts = ImageOptions { layout: ImageLayout::Hwc, mode: None, resize: Some((4, 4)) };
        let e = decode_column("img", &col, &opts, 10, &mut None).unwrap_err().to_string();
        assert!(e.contains("row 11") && e.contains("image_mode"), "{e}");
        let opts = ImageOptions { mode: Some(ImageMode::Rgb), ..opts };
        let (f, a) = decode_column("img", &col, &opts, 0, &mut None).unwrap();
        assert_eq!(a.len(), 2);
        assert!(f.metadata()[crate::arrow::EXTENSION_METADATA_KEY].contains("[4,4,3]"));
        let bad = BinaryArray::from(vec![&png(3, 2, true)[..], b"not an image"]);
        let e = decode_column("img", &bad, &ImageOptions::new(ImageLayout::Hwc), 5, &mut None).unwrap_err().to_string();
        assert!(e.contains("row 6") && e.contains("cannot decode"), "{e}");
    }
}
