//! The codec's fast reader agrees with the canonical decoder on every entry of
//! a real server log.

use reservoir_log::codec;
use reservoir_log::embedded::ENTRIES_CF;

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_decoder_equals_the_codec_on_a_server_log() {
    let (_dir, log_dir) = embedded_history().await;
    let db = rocksdb::DB::open_cf_for_read_only(
        &rocksdb::Options::default(),
        &log_dir,
        [ENTRIES_CF, "meta"],
        false,
    )
    .unwrap();
    let cf = db.cf_handle(ENTRIES_CF).unwrap();
    let mut fast_hits = 0;
    let mut n = 0;
    for item in db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
        let (_, value) = item.unwrap();
        let canonical = codec::decode_canonical(&value).unwrap();
        if let Some(fast) = codec::decode_fast(&value) {
            assert_eq!(fast, canonical);
            fast_hits += 1;
        }
        assert_eq!(codec::decode(&value).unwrap(), canonical);
        n += 1;
        // Every truncation is refused by the fast path or agrees with the codec.
        for cut in [1, 5, value.len() / 2, value.len() - 1] {
            let short = &value[..cut.min(value.len())];
            assert_eq!(codec::decode(short), codec::decode_canonical(short));
        }
    }
    assert!(n > 20, "{n} entries");
    assert_eq!(
        fast_hits, n,
        "the fast path decodes every current-schema entry"
    );
}
