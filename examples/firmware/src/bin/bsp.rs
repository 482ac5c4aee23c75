//! BSP alone with eight workers: the image whose `.text` size docs/guide/firmware.md
//! reports for "a BSP server fits in 32 KiB". Prints "PASS" and exits 0 only if it trained.

#![no_std]
#![no_main]

use cortex_m_rt::entry;
use syncopate_firmware::{Firmware, bsp_server};

#[entry]
fn main() -> ! {
    let mut firmware = Firmware::start("bsp");
    let _ = firmware.train("bsp", bsp_server);
    firmware.finish()
}
