//! The text stages as DataFusion scalar functions.
//!
//! | function | returns |
//! |---|---|
//! | `text_clean(text [, 'opt,opt'])` | the cleaned string (same string type as the input); options `collapse_whitespace`, `keep_newlines`, `keep_control`, `no_nfc`, `no_trim` |
//! | `text_quality(text [, 'preset'])` | true when the document passes the preset's rules (`gopher`, the default, or `none`) |
//! | `pii_mask(text)` | the string with personal data replaced by `<EMAIL>`, `<API_KEY>`, ... |
//! | `text_hash(text [, seed])` | XXH3-64 of the UTF-8 bytes, uint64 |
//!
//! Null strings give null.

use std::sync::{Arc, OnceLock};

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
}

/// One of the text scalar functions.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TextUdf {
    func: TextFn,
    signature: Signature,
}

/// The four text functions, ready to register.
pub fn text_udfs() -> Vec<ScalarUDF> {
    [TextFn::Clean, TextFn::Quality, TextFn::Pii, TextFn::Hash].into_iter().map(|func| ScalarUDF::from(TextUdf { func, signature: Signature::variadic_any(Volatility::Immutable) })).collect()
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
        let max = if self.func == TextFn::Pii { 1 } else { 2 };
        if args.is_empty() || args.len() > max {
            return plan_err!("{name} takes {} argument(s), got {}", if max == 1 { "1" } else { "1 or 2" }, args.len());
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
        }
    }
}
