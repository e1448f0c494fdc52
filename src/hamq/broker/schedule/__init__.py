"""Delay levels and timer messages (RocketMQ's ScheduleMessageService and TimerMessageStore)."""
