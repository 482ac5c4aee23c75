//! BSP, then DBW, each with eight workers on the same least-squares problem (the QEMU run
//! CI checks). Prints "PASS" and exits 0 only if both trained.

#![no_std]
#![no_main]

use cortex_m_rt::entry;
use syncopate_firmware::{Firmware, bsp_server, compare, dbw_server};

#[entry]
fn main() -> ! {
    let mut firmware = Firmware::start("train");
    let bsp = firmware.train("bsp", bsp_server);
    let dbw = firmware.train("dbw", dbw_server);
    if let (Some(bsp), Some(dbw)) = (bsp, dbw) {
        compare(("dbw", &dbw), ("bsp", &bsp));
    }
    firmware.finish()
}
