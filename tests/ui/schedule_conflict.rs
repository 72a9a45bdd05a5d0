#[ferriq::task(name = "ui.both", schedule = "0 * * * * *", every = 60)]
async fn both() {}

#[ferriq::task(name = "ui.zone_without_schedule", timezone = "Europe/Berlin")]
async fn zone() {}

#[ferriq::task(name = "ui.bad_policy", every = 5, missed = "sometimes")]
async fn policy() {}

fn main() {}
