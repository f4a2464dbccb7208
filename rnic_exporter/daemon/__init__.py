"""The long-running agent: polls, detects, publishes; owns time, threads and process tuning."""
