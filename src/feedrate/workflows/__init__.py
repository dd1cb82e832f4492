"""The workflows users call: tune, doctor, transfer. They orchestrate the layers below."""
