"""What is predicted: the ε-certainty classifier over cut fractions, its features and training."""
