//! Next-time computation with an injected clock: cron and intervals, DST in both directions
//! in Europe/Berlin and America/New_York (each tick once), leap days, far-away ticks.

use jiff::civil::date;
use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::{Cron, MissedTicks, ScheduleSpec};

fn tz(name: &str) -> TimeZone {
    TimeZone::get(name).unwrap()
}

/// A local time in `zone` as an instant (the earlier one of a repeated time).
fn at(zone: &str, y: i16, mo: i8, d: i8, h: i8, mi: i8, s: i8) -> Timestamp {
    tz(zone)
        .to_ambiguous_timestamp(date(y, mo, d).at(h, mi, s, 0))
        .earlier()
        .unwrap()
}

/// Every fire of `expr` in `zone` in `(from, until]`, as local times `HH:MM:SS+offset`.
fn fires(expr: &str, zone: &str, from: Timestamp, until: Timestamp) -> Vec<String> {
    let cron = Cron::parse(expr).unwrap();
    let zone_tz = tz(zone);
    let mut out = Vec::new();
    let mut t = from;
    while let Some(next) = cron.next_after(t, &zone_tz) {
        if next > until {
            break;
        }
        assert!(next > t, "time went backwards: {t} -> {next}");
        let z = next.to_zoned_datetime(zone_tz.clone());
        out.push(format!("{} {}", z.datetime(), z.offset()));
        t = next;
    }
    out
}

#[test]
fn fields_names_ranges_steps_and_lists() {
    let utc = TimeZone::UTC;
    let cron = Cron::parse("15,45 */20 9-17 * JAN-MAR MON-FRI").unwrap();
    // Friday 2027-01-01 08:59:59 UTC → 09:00:15 that day.
    let t = cron
        .next_after(at("UTC", 2027, 1, 1, 8, 59, 59), &utc)
        .unwrap();
    assert_eq!(t, at("UTC", 2027, 1, 1, 9, 0, 15));
    let t = cron.next_after(t, &utc).unwrap();
    assert_eq!(t, at("UTC", 2027, 1, 1, 9, 0, 45));
    let t = cron.next_after(t, &utc).unwrap();
    assert_eq!(t, at("UTC", 2027, 1, 1, 9, 20, 15));
    // After 17:40:45 on Friday: Monday 09:00:15.
    let t = cron
        .next_after(at("UTC", 2027, 1, 1, 17, 40, 45), &utc)
        .unwrap();
    assert_eq!(t, at("UTC", 2027, 1, 4, 9, 0, 15));
    // Five fields: seconds are 0; 7 is Sunday.
    let cron = Cron::parse("30 4 * * 7").unwrap();
    let t = cron
        .next_after(at("UTC", 2027, 1, 1, 0, 0, 0), &utc)
        .unwrap();
    assert_eq!(t, at("UTC", 2027, 1, 3, 4, 30, 0));
    for bad in [
        "* * * *",
        "60 * * * * *",
        "* * 24 * * *",
        "* * * 0 * *",
        "* * * * 13 *",
        "* * * * * 8",
        "*/0 * * * * *",
        "5-1 * * * * *",
        "* * * * FOO *",
    ] {
        assert!(Cron::parse(bad).is_err(), "{bad} should be refused");
    }
}

#[test]
fn last_day_nearest_weekday_and_nth_weekday() {
    let utc = TimeZone::UTC;
    let next =
        |expr: &str, from: Timestamp| Cron::parse(expr).unwrap().next_after(from, &utc).unwrap();
    let jan = at("UTC", 2027, 1, 1, 0, 0, 0);
    // L: the last day of each month (February 2028 is a leap month).
    assert_eq!(next("0 0 12 L * *", jan), at("UTC", 2027, 1, 31, 12, 0, 0));
    assert_eq!(
        next("0 0 12 L * *", at("UTC", 2028, 2, 1, 0, 0, 0)),
        at("UTC", 2028, 2, 29, 12, 0, 0)
    );
    // L-2.
    assert_eq!(next("0 0 0 L-2 * *", jan), at("UTC", 2027, 1, 29, 0, 0, 0));
    // 15W in May 2027: the 15th is a Saturday → Friday the 14th.
    assert_eq!(
        next("0 0 0 15W * *", at("UTC", 2027, 5, 1, 0, 0, 0)),
        at("UTC", 2027, 5, 14, 0, 0, 0)
    );
    // 1W in May 2027: Saturday the 1st → Monday the 3rd (not April).
    assert_eq!(
        next("0 0 0 1W * *", at("UTC", 2027, 4, 30, 0, 0, 0)),
        at("UTC", 2027, 5, 3, 0, 0, 0)
    );
    // LW in October 2027: the 31st is a Sunday → Friday the 29th.
    assert_eq!(
        next("0 0 0 LW * *", at("UTC", 2027, 10, 1, 0, 0, 0)),
        at("UTC", 2027, 10, 29, 0, 0, 0)
    );
    // FRI#3: the third Friday; 5L: the last Friday.
    assert_eq!(
        next("0 0 0 * * FRI#3", jan),
        at("UTC", 2027, 1, 15, 0, 0, 0)
    );
    assert_eq!(next("0 0 0 * * 5L", jan), at("UTC", 2027, 1, 29, 0, 0, 0));
    // Both day fields restricted: either matches (Vixie).
    assert_eq!(next("0 0 0 20 * MON", jan), at("UTC", 2027, 1, 4, 0, 0, 0));
}

#[test]
fn leap_days_and_ticks_years_away() {
    let utc = TimeZone::UTC;
    // Every 29 February: from 2029 the next is 2032.
    let leap = Cron::parse("0 0 0 29 2 *").unwrap();
    assert_eq!(
        leap.next_after(at("UTC", 2029, 1, 1, 0, 0, 0), &utc),
        Some(at("UTC", 2032, 2, 29, 0, 0, 0))
    );
    // 29 February on a Monday — or any Monday, by Vixie's rule; with `?` only the date counts.
    let rare = Cron::parse("0 0 0 29 2 ?").unwrap();
    assert_eq!(
        rare.next_after(at("UTC", 2028, 3, 1, 0, 0, 0), &utc),
        Some(at("UTC", 2032, 2, 29, 0, 0, 0))
    );
    // 29 February that is a Monday, years away: day-of-week with #/L restricted together.
    let monday_leap = Cron::parse("0 0 0 * 2 MON#5").unwrap();
    // The fifth Monday of a February happens only on 29 February that is a Monday: 2044.
    assert_eq!(
        monday_leap.next_after(at("UTC", 2027, 1, 1, 0, 0, 0), &utc),
        Some(at("UTC", 2044, 2, 29, 0, 0, 0))
    );
    // Never: 30 February.
    assert_eq!(
        Cron::parse("0 0 0 30 2 *")
            .unwrap()
            .next_after(at("UTC", 2027, 1, 1, 0, 0, 0), &utc),
        None
    );
}

#[test]
fn spring_forward_in_berlin_and_new_york_fires_each_tick_once() {
    // Europe/Berlin 2027-03-28: 02:00 → 03:00. A daily 02:30 fires once, at 03:00 (the jump).
    let day = fires(
        "0 30 2 * * *",
        "Europe/Berlin",
        at("Europe/Berlin", 2027, 3, 27, 12, 0, 0),
        at("Europe/Berlin", 2027, 3, 29, 12, 0, 0),
    );
    assert_eq!(
        day,
        ["2027-03-28T03:00:00 +02", "2027-03-29T02:30:00 +02"],
        "the skipped 02:30 fires once at the jump, then as usual"
    );
    // Every 15 minutes through the gap: 01:45, then 03:00 once (the skipped quarter hours all
    // collapse onto the jump), then 03:15.
    let quarters = fires(
        "0 */15 * * * *",
        "America/New_York",
        at("America/New_York", 2027, 3, 14, 1, 40, 0),
        at("America/New_York", 2027, 3, 14, 3, 20, 0),
    );
    assert_eq!(
        quarters,
        [
            "2027-03-14T01:45:00 -05",
            "2027-03-14T03:00:00 -04",
            "2027-03-14T03:15:00 -04"
        ]
    );
}

#[test]
fn fall_back_in_berlin_and_new_york_fires_each_tick_once() {
    // America/New_York 2027-11-07: 02:00 → 01:00. A daily 01:30 fires once, the first time.
    let day = fires(
        "0 30 1 * * *",
        "America/New_York",
        at("America/New_York", 2027, 11, 6, 12, 0, 0),
        at("America/New_York", 2027, 11, 8, 12, 0, 0),
    );
    assert_eq!(day, ["2027-11-07T01:30:00 -04", "2027-11-08T01:30:00 -05"]);
    // Europe/Berlin 2027-10-31: 03:00 → 02:00. Every 30 minutes from 01:00 to 04:00 local:
    // the repeated 02:00 and 02:30 fire once each (the first time).
    let halves = fires(
        "0 0,30 * * * *",
        "Europe/Berlin",
        at("Europe/Berlin", 2027, 10, 31, 0, 59, 0),
        at("Europe/Berlin", 2027, 10, 31, 4, 0, 0),
    );
    assert_eq!(
        halves,
        [
            "2027-10-31T01:00:00 +02",
            "2027-10-31T01:30:00 +02",
            "2027-10-31T02:00:00 +02",
            "2027-10-31T02:30:00 +02",
            "2027-10-31T03:00:00 +01",
            "2027-10-31T03:30:00 +01",
            "2027-10-31T04:00:00 +01"
        ]
    );
    // A scheduler that starts in the second pass of the repeated hour does not fire its
    // local times again.
    let cron = Cron::parse("0 30 2 * * *").unwrap();
    let second_pass = tz("Europe/Berlin")
        .to_ambiguous_timestamp(date(2027, 10, 31).at(2, 15, 0, 0))
        .later()
        .unwrap();
    let next = cron.next_after(second_pass, &tz("Europe/Berlin")).unwrap();
    assert_eq!(next, at("Europe/Berlin", 2027, 11, 1, 2, 30, 0));
}

#[test]
fn intervals_and_tick_ids() {
    let spec = ScheduleSpec::every("metrics", "app.collect", 30);
    let compiled = spec.compile().unwrap();
    assert_eq!(compiled.next_after(1_000_000_005), Some(1_000_000_020));
    assert_eq!(compiled.next_after(1_000_000_020), Some(1_000_000_050));
    assert_eq!(
        compiled.ticks_between(1_000_000_000, 1_000_000_100, 100),
        [1_000_000_020, 1_000_000_050, 1_000_000_080]
    );
    // A long outage keeps the latest ticks only.
    assert_eq!(
        compiled.ticks_between(0, 1_000_000_100, 2),
        [1_000_000_050, 1_000_000_080]
    );
    assert_eq!(spec.tick_id(1_000_000_010), spec.tick_id(1_000_000_010));
    assert_ne!(spec.tick_id(1_000_000_010), spec.tick_id(1_000_000_040));
    assert_eq!(MissedTicks::default(), MissedTicks::Latest);
    let bad = ScheduleSpec::cron("r", "t", "0 0 8 * * MON").in_timezone("Mars/Olympus");
    assert!(bad
        .compile()
        .unwrap_err()
        .to_string()
        .contains("Mars/Olympus"));
}
