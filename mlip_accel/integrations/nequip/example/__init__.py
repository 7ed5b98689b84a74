"""Example NequIP training with mlip_accel: ``train.yaml`` and the script making its dataset."""
