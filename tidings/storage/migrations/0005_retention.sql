-- What the retention sweeper scans: events by age, finished deliveries by their last change.
CREATE INDEX events_created ON events (created_at);
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (updated_at)
    WHERE status IN ('succeeded', 'failed');
