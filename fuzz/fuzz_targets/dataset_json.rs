//! Arbitrary `dataset.json` over a root holding two small stores (and a symlink out of the
//! root): open is a typed error or a dataset whose streams read the right records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zrecord::prelude::*;
use zrecord::store::Dataset;

fuzz_target!(|text: &[u8]| {
    let dir = zrecord_fuzz::scratch();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    for (p, n, fill) in [(root.join("a"), 4, 1u8), (root.join("b.zrec"), 4, 2), (outside.clone(), 4, 3), (root.join("short"), 3, 4)] {
        let mut w = DenseWriter::create(&p, DType::UInt8, &[2], WriterOptions::default()).unwrap();
        w.append_slice(&vec![fill; n * 2]).unwrap();
        w.finish().unwrap();
    }
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    std::fs::write(root.join("dataset.json"), text).unwrap();
    let Ok(d) = Dataset::open(&root) else { return };
    let alloc = Allocator::cpu(0);
    for s in d.streams() {
        let v = zrecord::loader::SourceView::new(s.source.clone(), &alloc);
        if let Ok(b) = v.gather(&[0]) {
            let bytes = b.as_dense().map(|t| t.as_bytes().to_vec()).unwrap_or_default();
            assert!(bytes != [3, 3], "stream '{}' reads the store outside the root", s.name);
        }
    }
});
