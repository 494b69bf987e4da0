//! File sources for conversion: Parquet, Arrow IPC (file or stream format), CSV / TSV and
//! newline-delimited JSON, as one path, a folder, a glob, or a Hugging Face `save_to_disk`
//! folder. Files are read in path order, one record batch at a time.

use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::Location;

/// A file format conversion reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// Apache Parquet.
    Parquet,
    /// Arrow IPC, file or stream format (`.arrow`, `.feather`, `.ipc`, Hugging Face caches).
    Arrow,
    /// Comma-separated values with a header row (`.tsv`: tab-separated).
    Csv,
    /// Newline-delimited JSON objects.
    Json,
}

impl FileFormat {
    /// The format a file name's extension says, if any.
    pub fn of_path(path: &Path) -> Option<FileFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "parquet" | "pq" => FileFormat::Parquet,
            "arrow" | "arrows" | "feather" | "ipc" => FileFormat::Arrow,
            "csv" | "tsv" => FileFormat::Csv,
            "json" | "jsonl" | "ndjson" => FileFormat::Json,
            _ => return None,
        })
    }
}

/// Batches read from files, with what is known about them up front.
pub struct FileInput {
    /// The schema every batch has.
    pub schema: SchemaRef,
    /// The batches, in file order.
    pub batches: Box<dyn Iterator<Item = Result<RecordBatch>> + Send>,
    /// Total rows when the files say (Parquet footers, Hugging Face split info).
    pub total_rows: Option<u64>,
    /// Hugging Face `Features` (from `dataset_info.json` or the schema's `huggingface` key).
    pub features: Option<Value>,
    /// Hugging Face dataset info (description, citation, ...), for a `save_to_disk` folder.
    pub info: Option<Value>,
    /// The files read.
    pub files: Vec<PathBuf>,
    /// Their format.
    pub format: FileFormat,
}

impl FileInput {
    /// `dataset.json` metadata describing the source: its kind and files, and for a
    /// `save_to_disk` folder the dataset's description, citation, homepage, license, names.
    pub fn metadata(&self) -> serde_json::Map<String, Value> {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "source".into(),
            serde_json::json!({
                "kind": format!("{:?}", self.format).to_lowercase(),
                "files": self.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            }),
        );
        if let Some(info) = &self.info {
            let keep = ["description", "citation", "homepage", "license", "dataset_name", "config_name", "version", "builder_name"];
            let hf: serde_json::Map<String, Value> = keep
                .iter()
                .filter_map(|&k| info.get(k).filter(|v| !v.is_null() && v.as_str() != Some("")).map(|v| (k.to_string(), v.clone())))
                .collect();
            meta.insert("huggingface".into(), Value::Object(hf));
        }
        meta
    }
}

/// Rows per batch read from CSV / JSON.
const TEXT_BATCH_ROWS: usize = 8192;

fn read_json_file(path: &Path) -> Result<Value> {
    let bytes = crate::io::LocalFolder::new(path.parent().unwrap_or(Path::new(".")), Default::default())
        .read_small(path.file_name().and_then(|n| n.to_str()).unwrap_or_default(), 64 << 20)?
        .ok_or_else(|| Error::NotFound { path: path.to_path_buf(), reason: "no such file".into() })?;
    serde_json::from_slice(&bytes).map_err(|e| Error::invalid("source", format!("{}: not valid JSON: {e}", path.display())))
}

/// The files `source` names: a file, a folder of files of one format, a glob, or a Hugging
/// Face `save_to_disk` folder (`state.json` lists its Arrow files).
pub fn open_files(source: &str) -> Result<FileInput> {
    let path = Path::new(source);
    let mut features = None;
    let mut info = None;
    let mut total_rows = None;
    let (files, format) = if path.is_dir() {
        if path.join("dataset_dict.json").exists() {
            let splits = read_json_file(&path.join("dataset_dict.json"))
                .ok()
                .and_then(|v| v.get("splits").cloned())
                .map(|s| s.to_string())
                .unwrap_or_else(|| "?".into());
            return Err(Error::invalid(
                "source",
                format!("{source} is a Hugging Face DatasetDict (splits {splits}); convert one split folder, e.g. {source}/train"),
            ));
        }
        if path.join("state.json").exists() {
            let state = read_json_file(&path.join("state.json"))?;
            let names: Vec<&str> = state
                .get("_data_files")
                .and_then(|f| f.as_array())
                .ok_or_else(|| Error::invalid("source", format!("{source}/state.json has no _data_files list")))?
                .iter()
                .map(|f| f.get("filename").and_then(|n| n.as_str()))
                .collect::<Option<_>>()
                .ok_or_else(|| Error::invalid("source", format!("{source}/state.json: a data file without a filename")))?;
            if names.is_empty() {
                return Err(Error::invalid("source", format!("{source}/state.json lists no data files")));
            }
            // Every name stays inside the folder: no `..`, no absolute path, no symlink out.
            let files = names
                .iter()
                .map(|n| {
                    crate::io::join_contained(path, n)
                        .map_err(|e| Error::invalid("source", format!("{source}/state.json names a file outside the folder ({n:?}): {e}")))
                })
                .collect::<Result<Vec<PathBuf>>>()?;
            if let Ok(i) = read_json_file(&path.join("dataset_info.json")) {
                features = i.get("features").cloned();
                info = Some(i);
            }
            (files, FileFormat::Arrow)
        } else {
            let files: Vec<PathBuf> =
                crate::io::list_dir(path)?.into_iter().filter(|e| e.is_file && FileFormat::of_path(&e.path).is_some()).map(|e| e.path).collect();
            let format = one_format(source, &files)?;
            (files, format)
        }
    } else if source.contains(['*', '?', '[']) {
        let mut files: Vec<PathBuf> = glob::glob(source)
            .map_err(|e| Error::invalid("source", format!("bad glob pattern {source}: {e}")))?
            .filter_map(|p| p.ok())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        let format = one_format(source, &files)?;
        (files, format)
    } else if path.is_file() {
        let format = FileFormat::of_path(path).ok_or_else(|| {
            Error::invalid("source", format!("{source}: unknown file type (expected .parquet, .arrow/.feather, .csv/.tsv or .json/.jsonl)"))
        })?;
        (vec![path.to_path_buf()], format)
    } else {
        return Err(Error::NotFound { path: path.to_path_buf(), reason: "no such file, folder or matching glob".into() });
    };
    let mut readers = Vec::with_capacity(files.len());
    for f in &files {
        readers.push(open_one(f, format)?);
    }
    let schema = readers.first().map(|r| r.0.clone()).ok_or_else(|| Error::NotFound { path: path.to_path_buf(), reason: "no data files found".into() })?;
    for (f, (s, _, _)) in files.iter().zip(&readers).skip(1) {
        if s.fields() != schema.fields() {
            return Err(Error::invalid("source", format!("{} has schema {s:?}, but {} has {schema:?}", f.display(), files[0].display())));
        }
    }
    if format == FileFormat::Parquet {
        total_rows = Some(readers.iter().map(|r| r.2.unwrap_or(0)).sum());
    }
    if features.is_none() {
        features = super::hf_features(&schema);
    }
    let batches = readers.into_iter().flat_map(|(_, it, _)| it);
    Ok(FileInput { schema, batches: Box::new(batches), total_rows, features, info, files, format })
}

fn one_format(source: &str, files: &[PathBuf]) -> Result<FileFormat> {
    let first = files.first().ok_or_else(|| Error::NotFound { path: source.into(), reason: "no data files found".into() })?;
    let format = FileFormat::of_path(first)
        .ok_or_else(|| Error::invalid("source", format!("{}: unknown file type", first.display())))?;
    if let Some(other) = files.iter().find(|f| FileFormat::of_path(f) != Some(format)) {
        return Err(Error::invalid("source", format!("{source} mixes file types ({} and {}); convert one kind at a time", first.display(), other.display())));
    }
    Ok(format)
}

type Batches = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// One file: its schema, its batches, and its row count when the file says.
fn open_one(path: &Path, format: FileFormat) -> Result<(SchemaRef, Batches, Option<u64>)> {
    let (file, file_len) = crate::io::open_regular(path)?
        .ok_or_else(|| Error::NotFound { path: path.to_path_buf(), reason: "no such file".into() })?;
    let ctx = |e: arrow_schema::ArrowError| Error::Arrow(e).context(format!("reading {}", path.display()));
    let p = path.to_path_buf();
    let wrap = move |r: std::result::Result<RecordBatch, arrow_schema::ArrowError>| {
        r.map_err(|e| Error::Arrow(e).context(format!("reading {}", p.display())))
    };
    Ok(match format {
        FileFormat::Parquet => {
            let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| Error::invalid("source", format!("{}: not a readable Parquet file: {e}", path.display())))?;
            let rows = b.metadata().file_metadata().num_rows().max(0) as u64;
            // The builder's schema keeps the file's key-value metadata (e.g. `huggingface`).
            let schema = b.schema().clone();
            let r = b.build().map_err(|e| Error::invalid("source", format!("{}: {e}", path.display())))?;
            (schema, Box::new(r.map(wrap)), Some(rows))
        }
        FileFormat::Arrow => {
            let mut file = file;
            // The file format starts with "ARROW1"; anything else is tried as a stream
            // (Hugging Face caches and save_to_disk folders use the stream format).
            let mut magic = [0u8; 6];
            let is_file = std::io::Read::read_exact(&mut file, &mut magic).is_ok() && &magic == b"ARROW1";
            // Every message's sizes are checked against the file before arrow-rs reads it
            // (it allocates a message body as announced), and any panic inside the reader is
            // a typed error at this boundary.
            super::ipc_check::check(&mut file, is_file, file_len).map_err(|reason| Error::corrupt(path, format!("not a well-formed Arrow IPC {}: {reason}", if is_file { "file" } else { "stream" })))?;
            file.rewind().map_err(|e| Error::io(path, e))?;
            let p = path.to_path_buf();
            let guard = move |what: &str, e: Box<dyn std::any::Any + Send>| super::ipc_check::panic_error(&p, what, e);
            if is_file {
                let r = std::panic::catch_unwind(move || arrow_ipc::reader::FileReader::try_new(BufReader::new(file), None))
                    .map_err(|e| guard("opening", e))?
                    .map_err(ctx)?;
                let schema = r.schema();
                (schema, Box::new(super::ipc_check::Contained::new(r, path).map(wrap)), None)
            } else {
                let r = std::panic::catch_unwind(move || arrow_ipc::reader::StreamReader::try_new(BufReader::new(file), None))
                    .map_err(|e| guard("opening", e))?
                    .map_err(ctx)?;
                let schema = r.schema();
                (schema, Box::new(super::ipc_check::Contained::new(r, path).map(wrap)), None)
            }
        }
        FileFormat::Csv => {
            let tsv = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("tsv"));
            let mut fmt = arrow_csv::reader::Format::default().with_header(true);
            if tsv {
                fmt = fmt.with_delimiter(b'\t');
            }
            let mut file = file;
            let (schema, _) = fmt.infer_schema(&mut file, Some(10_000)).map_err(ctx)?;
            file.rewind().map_err(|e| Error::io(path, e))?;
            let schema = Arc::new(schema);
            let r = arrow_csv::ReaderBuilder::new(schema.clone()).with_format(fmt).with_batch_size(TEXT_BATCH_ROWS).build(file).map_err(ctx)?;
            (schema, Box::new(r.map(wrap)), None)
        }
        FileFormat::Json => {
            let mut reader = BufReader::new(file);
            let (schema, _) = arrow_json::reader::infer_json_schema_from_seekable(&mut reader, Some(10_000)).map_err(ctx)?;
            let schema: SchemaRef = Arc::new(Schema::new(schema.fields().clone()));
            let r = arrow_json::ReaderBuilder::new(schema.clone()).with_batch_size(TEXT_BATCH_ROWS).build(reader).map_err(ctx)?;
            (schema, Box::new(r.map(wrap)), None)
        }
    })
}
