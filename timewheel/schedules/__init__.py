"""Recurring schedules: cron and interval maths, their model, operations, planner and listing."""
