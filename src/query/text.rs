//! The text stages as DataFusion scalar functions.
//!
//! | function | returns |
//! |---|---|
//! | `text_clean(text [, 'opt,opt'])` | the cleaned string (same string type as the input); options `collapse_whitespace`, `keep_newlines`, `keep_control`, `no_nfc`, `no_trim` |
//! | `text_quality(text [, 'preset'])` | true when the document passes the preset's rules (`gopher`, the default, or `none`) |
//! | `pii_mask(text)` | the string with personal data replaced by `<EMAIL>`, `<API_KEY>`, ... |
//! | `text_hash(text [, seed])` | XXH3-64 of the UTF-8 bytes, uint64 |
//! | `text_tokenize(text, 'tokenizer.json')` | token ids, `List<Int32>` (a ragged int32 stream when copied into a dataset root) |
//!
//! Null strings give null. A tokenizer file is loaded once per path (again when it changes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::{Array, ArrayRef, BooleanArray};
use arrow_schema::DataType;
use datafusion::common::{plan_err, Result as DfResult, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::error::{Error, Result};
use crate::query::df_err;
use crate::text::{Cleaner, PiiMasker, QualityFilter, QualityRules, StringTensor};

/// Which function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TextFn {
    Clean,
    Quality,
    Pii,
    Hash,
    Tokenize,
}

/// One of the text scalar functions.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TextUdf {
    func: TextFn,
    signature: Signature,
}

/// The text functions, ready to register.
pub fn text_udfs() -> Vec<ScalarUDF> {
    [TextFn::Clean, TextFn::Quality, TextFn::Pii, TextFn::Hash, TextFn::Tokenize].into_iter().map(|func| ScalarUDF::from(TextUdf { func, signature: Signature::variadic_any(Volatility::Immutable) })).collect()
}

/// The tokenizer at `path`, loaded once and again when the file's size or mtime changes.
fn shared_tokenizer(path: &str) -> Result<Arc<crate::text::Tokenizer>> {
    type Cache = Mutex<HashMap<String, (Option<std::time::SystemTime>, u64, Arc<crate::text::Tokenizer>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let (len, modified) = crate::io::stat(std::path::Path::new(path))?;
    let key = (modified, len);
    let cache = CACHE.get_or_init(Default::default);
    if let Some((m, l, t)) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(path) {
        if (*m, *l) == key {
            return Ok(t.clone());
        }
    }
    let t = Arc::new(crate::text::Tokenizer::from_file(path)?);
    cache.lock().unwrap_or_else(|p| p.into_inner()).insert(path.to_string(), (key.0, key.1, t.clone()));
    Ok(t)
}

fn token_field() -> arrow_schema::FieldRef {
    Arc::new(arrow_schema::Field::new_list_field(DataType::Int32, true))
}

fn token_list_type() -> DataType {
    DataType::List(token_field())
}

fn shared_masker() -> &'static PiiMasker {
    static M: OnceLock<PiiMasker> = OnceLock::new();
    M.get_or_init(PiiMasker::default)
}

/// `text_clean`'s options string.
pub fn cleaner_from_options(opts: &str) -> Result<Cleaner> {
    let mut c = Cleaner::default();
    for o in opts.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match o {
            "collapse_whitespace" => c.collapse_whitespace = true,
            "keep_newlines" => c.normalize_newlines = false,
            "keep_control" => c.strip_control = false,
            "no_nfc" => c.nfc = false,
            "no_trim" => c.trim = false,
            other => return Err(Error::invalid("text_clean", format!("unknown option '{other}' (collapse_whitespace, keep_newlines, keep_control, no_nfc, no_trim)"))),
        }
    }
    Ok(c)
}

impl TextUdf {
    fn name_str(&self) -> &'static str {
        match self.func {
            TextFn::Clean => "text_clean",
            TextFn::Quality => "text_quality",
            TextFn::Pii => "pii_mask",
            TextFn::Hash => "text_hash",
            TextFn::Tokenize => "text_tokenize",
        }
    }

    /// The literal second argument, if any.
    fn option(&self, args: &[ColumnarValue]) -> DfResult<Option<ScalarValue>> {
        match args.get(1) {
            None => Ok(None),
            Some(ColumnarValue::Scalar(s)) => Ok(Some(s.clone())),
            Some(ColumnarValue::Array(_)) => plan_err!("{}: the second argument must be a constant", self.name_str()),
        }
    }
}

impl ScalarUDFImpl for TextUdf {
    fn name(&self) -> &str {
        self.name_str()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        let name = self.name_str();
        let (min, max) = match self.func {
            TextFn::Pii => (1, 1),
            TextFn::Tokenize => (2, 2),
            _ => (1, 2),
        };
        if args.len() < min || args.len() > max {
            let want = match (min, max) {
                (1, 1) => "1",
                (2, 2) => "2 (text, 'path/to/tokenizer.json')",
                _ => "1 or 2",
            };
            return plan_err!("{name} takes {want} argument(s), got {}", args.len());
        }
        let text = match &args[0] {
            t @ (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => t.clone(),
            DataType::Null => DataType::Utf8View,
            t => return plan_err!("{name} takes a string, not {t}"),
        };
        if let Some(t) = args.get(1) {
            let ok = match self.func {
                TextFn::Hash => t.is_integer() || *t == DataType::Null,
                _ => matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View),
            };
            if !ok {
                return plan_err!("{name}: the second argument cannot be {t}");
            }
        }
        Ok(match self.func {
            TextFn::Clean | TextFn::Pii => text,
            TextFn::Quality => DataType::Boolean,
            TextFn::Hash => DataType::UInt64,
            TextFn::Tokenize => token_list_type(),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let opt = self.option(&args.args)?;
        let input = args.args[0].to_array(args.number_rows)?;
        let out_type = args.return_field.data_type().clone();
        let out = self.eval(&input, opt, &out_type).map_err(df_err)?;
        Ok(ColumnarValue::Array(out))
    }
}

impl TextUdf {
    fn eval(&self, input: &ArrayRef, opt: Option<ScalarValue>, out_type: &DataType) -> Result<ArrayRef> {
        let input: ArrayRef = if input.data_type() == &DataType::Null { arrow_array::new_null_array(&DataType::Utf8View, input.len()) } else { input.clone() };
        let (strings, _) = StringTensor::from_arrow(input.as_ref())?;
        let opt_str = |o: &Option<ScalarValue>| -> Result<Option<String>> {
            match o {
                None => Ok(None),
                Some(ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s)) => Ok(s.clone()),
                Some(other) => Err(Error::invalid(self.name_str(), format!("option {other} is not a string"))),
            }
        };
        let stage_out = |s: crate::text::StageOutput| -> Result<ArrayRef> { s.text.to_arrow_type(out_type) };
        match self.func {
            TextFn::Clean => {
                let c = cleaner_from_options(&opt_str(&opt)?.unwrap_or_default())?;
                stage_out(crate::text::TextPipeline::new(vec![crate::text::Stage::Clean(c)]).run(&strings)?)
            }
            TextFn::Pii => stage_out(crate::text::TextPipeline::new(vec![crate::text::Stage::Pii(shared_masker().clone())]).run(&strings)?),
            TextFn::Quality => {
                let rules = match opt_str(&opt)? {
                    Some(p) => QualityRules::preset(&p)?,
                    None => QualityRules::gopher(),
                };
                let q = QualityFilter::new(rules);
                let keep = crate::text::TextPipeline::new(vec![crate::text::Stage::Quality(q)]).run(&strings)?.keep;
                Ok(Arc::new(BooleanArray::new(keep.values().clone(), strings.as_arrow().nulls().cloned())))
            }
            TextFn::Hash => {
                let seed = match opt {
                    None | Some(ScalarValue::Null) => 0,
                    Some(s) => {
                        let v = s.cast_to(&DataType::UInt64).map_err(|e| Error::invalid("text_hash", format!("seed {s}: {e}")))?;
                        match v {
                            ScalarValue::UInt64(Some(v)) => v,
                            _ => 0,
                        }
                    }
                };
                Ok(Arc::new(strings.hash(seed)))
            }
            TextFn::Tokenize => {
                let path = opt_str(&opt)?.ok_or_else(|| Error::invalid("text_tokenize", "the tokenizer path is NULL"))?;
                let tk = shared_tokenizer(&path)?;
                let ids = tk.encode_ids(&strings)?;
                let mut offsets = Vec::with_capacity(ids.len() + 1);
                offsets.push(0i32);
                let mut values: Vec<i32> = Vec::with_capacity(ids.iter().map(Vec::len).sum());
                for row in &ids {
                    for &t in row {
                        values.push(i32::try_from(t).map_err(|_| Error::invalid("text_tokenize", format!("token id {t} does not fit int32")))?);
                    }
                    let end = i32::try_from(values.len()).map_err(|_| Error::invalid("text_tokenize", "more than 2^31 tokens in one batch"))?;
                    offsets.push(end);
                }
                let list = arrow_array::ListArray::try_new(
                    token_field(),
                    arrow_buffer::OffsetBuffer::new(arrow_buffer::ScalarBuffer::from(offsets)),
                    Arc::new(arrow_array::Int32Array::from(values)),
                    strings.as_arrow().nulls().cloned(),
                )?;
                Ok(Arc::new(list))
            }
        }
    }
}
