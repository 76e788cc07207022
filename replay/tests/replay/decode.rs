//! The fast decoder agrees with the canonical codec on every entry of a real log.

use reservoir_log::codec;
use reservoir_log::embedded::ENTRIES_CF;
use reservoir_replay::decode;

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
        let canonical = codec::decode(&value).unwrap();
        if let Some(fast) = decode::fast(&value) {
            assert_eq!(fast, canonical);
            fast_hits += 1;
        }
        assert_eq!(decode::decode(&value).unwrap(), canonical);
        n += 1;
        // Every truncation is refused by the fast path or agrees with the codec.
        for cut in [1, 5, value.len() / 2, value.len() - 1] {
            let short = &value[..cut.min(value.len())];
            assert_eq!(decode::decode(short).is_ok(), codec::decode(short).is_ok());
        }
    }
    assert!(n > 20, "{n} entries");
    assert_eq!(
        fast_hits, n,
        "the fast path decodes every current-schema entry"
    );
}
