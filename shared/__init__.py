"""What both parties must agree on: label domains, mechanism descriptions, debiasing, wire schemas."""
