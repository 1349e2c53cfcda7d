"""How the supervisor starts a role instance: local processes, Ray actors; and the trainer on Cloud TPU."""
