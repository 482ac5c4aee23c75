//! The plots of `compare --plot`, read back from the SVG: a colour of its own for every run
//! (more runs than a fixed palette has), and axes that end at the data, not far past it.

mod common;

use common::{scratch, stdout, syncopate};

/// Every `attr="#RRGGBB"` colour in `svg` but black, white and the mesh greys.
fn colours(svg: &str, attr: &str) -> std::collections::BTreeSet<String> {
    let needle = format!("{attr}=\"#");
    svg.match_indices(&needle)
        .filter_map(|(i, _)| svg.get(i + needle.len()..i + needle.len() + 6))
        .map(str::to_ascii_uppercase)
        // Greys (black and white included) have three equal channels.
        .filter(|c| !(c[0..2] == c[2..4] && c[2..4] == c[4..6]))
        .collect()
}

/// The numbers the SVG prints on its own (the axes' tick labels).
fn tick_values(svg: &str) -> Vec<f64> {
    svg.split("</text>")
        .filter_map(|part| part.rsplit_once('>').map(|(_, text)| text.trim()))
        .filter_map(|text| text.parse::<f64>().ok())
        .collect()
}

/// Runs `compare` on `scenario` with `--plot --json`; returns the SVG and the JSON.
fn plot(name: &str, scenario: &str) -> (String, serde_json::Value) {
    let dir = scratch("plot-svg", name);
    let (file, svg) = (dir.join("s.toml"), dir.join("p.svg"));
    std::fs::write(&file, scenario).unwrap();
    let out = syncopate(&["compare", file.to_str().unwrap(), "--plot", svg.to_str().unwrap(), "--json"]);
    let json = serde_json::from_str(&stdout(&out)).unwrap();
    let svg = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    (svg, json)
}

fn latest_time_to_target(json: &serde_json::Value) -> f64 {
    json["runs"].as_array().unwrap().iter().filter_map(|r| r["time_to_target_s"].as_f64()).fold(0.0, f64::max)
}

#[test]
fn a_sweep_of_fifteen_runs_gets_fifteen_colours_and_axes_at_the_data() {
    let scenario = "workers = 14\nseeds = 1\nmax_time_s = 1.0\n[[stragglers]]\nworkers = \"all\"\nmodel = \"exp=1/1\"\n\
                    [[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"backup\"\nbackup_workers = \"0..=12\"\n\
                    [[protocols]]\nname = \"dbw\"\n";
    let (svg, json) = plot("sweep", scenario);
    let runs = json["runs"].as_array().unwrap().len();
    assert_eq!(runs, 15);
    // One bar per run, each filled with its own colour.
    assert!(colours(&svg, "fill").len() >= runs, "{:?}", colours(&svg, "fill"));
    assert!(svg.contains("time to target against backup b"), "the sweep is drawn against its knob");
    let latest = latest_time_to_target(&json);
    assert!(latest > 0.0, "{json}");
    for v in tick_values(&svg) {
        // Knob values (up to 12) and times (up to the latest time to target, with margins).
        assert!(v <= 12.5 || v <= latest * 1.3, "tick {v} beyond the data (latest {latest})");
    }
}

#[test]
fn accuracy_curves_get_their_own_colours_and_the_time_axis_ends_near_the_slowest_run() {
    let scenario = "workers = 4\nseeds = 1\nmax_time_s = 3.0\n[[stragglers]]\nworkers = \"0\"\nmodel = \"slow=3\"\n\
                    [[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"asp\"\n[[protocols]]\nname = \"ssp\"\n\
                    [[protocols]]\nname = \"backup\"\nbackup_workers = 1\n";
    let (svg, json) = plot("curves", scenario);
    let runs = json["runs"].as_array().unwrap().len();
    assert!(colours(&svg, "stroke").len() >= runs, "{:?}", colours(&svg, "stroke"));
    let latest = latest_time_to_target(&json);
    assert!(latest > 0.0 && latest < 2.0, "{json}");
    let ticks = tick_values(&svg);
    let beyond: Vec<f64> = ticks.iter().copied().filter(|v| *v > latest * 1.3 && *v > 1.0).collect();
    assert!(beyond.is_empty(), "ticks {beyond:?} beyond the data (latest time to target {latest}, budget 3 s)");
}
